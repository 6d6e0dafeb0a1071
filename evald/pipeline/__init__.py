"""Build the network once, hot-swap each checkpoint into it, evaluate the fixed subset.

- ``pipeline.py``: the ``Pipeline``: build when the factories are known, evaluate one step,
  say whether it was evaluated, failed (a bad file) or must be retried
- ``network.py``: the network compiled once, its tasks and its subset
- ``weights.py``, ``hot_swap.py``, ``name_fit.py``, ``slice_merge.py``: reading weights into the
  network's memory, fitting names, merging tensor-parallel slices
- ``swap_check.py``, ``provenance.py``: proof of each swap; which weights, subset and
  configuration produced a point
- ``subset.py``, ``factories.py``, ``device.py``: the seeded subset, the user's factories, the device
- ``framework_logs.py``: a framework a factory imports (MindFormers) logs its INFO lines to its own files
- ``group_protocol.py``, ``group_evaluator.py``, ``group_scoring.py``: the same evaluation (and a suite's
  requests) on several devices
- ``scoring.py``, ``tokenizer.py``, ``lm_adapter.py``, ``suites.py``: benchmark suites: token log-probs and
  greedy generation in fixed buckets, the tokenizer factory, lm-eval's ``LM``, suites and their identities
- ``tasks/``, ``metrics/``: Graph-mode eval cells and their metrics
- ``lm_eval_metrics.py``: the metric names each lm-eval task of a suite reports (for ``--monitor``'s check)

May import: config, contracts, ledger, files.
"""
