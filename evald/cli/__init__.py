"""The ``evald`` command and its subcommands: ``evald`` (the daemon), ``status``, ``retry``,
``compare``, ``subset`` and ``keys``. It parses and validates the command line once, then hands a
``ResolvedConfig`` to the daemon or runs a read-only report.

- ``main.py``: the argument parser and the dispatch to a subcommand
- ``commands.py``: ``status``, ``retry``, ``compare``, ``subset``
- ``compare.py``: ``evald compare STEP_A STEP_B``: two steps' suite results paired by document
- ``status.py``, ``step_report.py``: a run's state, and what happened to one step
- ``fleet.py``: ``evald backfill --fleet-dir``: a fleet worker's index (options, Slurm, Kubernetes), its plan, the merge
- ``export.py``: ``evald export``: a run's suite cells as lm-eval, Every Eval Ever and Hugging Face files
- ``keys.py``: ``evald keys DIR`` writes CURVE key bundles (docs/authentication.md)

May import: every other package of evald (it is the top layer).
"""
