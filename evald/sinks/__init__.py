"""Where results go, written from what the ledger committed: TensorBoard records (the
ledger's outbox), the control channel and its retention leases, the best-checkpoint
pointer, and the run summary.

- ``sink.py``: what a sink is (``tick(RunState)``, ``close()``) and the committed state the run ticks its list
  of sinks with, after every turn
- ``tensorboard.py`` (the outbox's writer), ``tensorboard_layout.py`` (the Custom Scalars layout, the shown tags)
- ``control.py`` (the publisher, and the run's control sink), ``leases.py``, ``best_pointer.py``
- ``summary.py`` (summary.json), ``summary_table.py`` (its Markdown table)
- ``counters.py`` (counters.json): what the loop did with the messages it got
- ``sample_files.py``: the paired SE of a suite monitor, from the per-sample outputs (read with
  ``ledger/samples.py``)
- ``export_cells.py``, ``lm_eval_files.py``, ``every_eval_ever.py``, ``hf_eval_results.py``: ``evald
  export``'s cells, and each format it writes (lm-eval's own files, Every Eval Ever, Hugging Face
  ``.eval_results``), each through ``export_target.py`` (staged, renamed into ``--out``, never through
  a link)

May import: config, contracts, ledger, decisions.
"""
