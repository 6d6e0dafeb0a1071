"""Decisions without I/O: early stop, the best step, health alerts and learning-rate advice,
each with its reason. The daemon persists their state in the ledger.

- ``decisions.py``: the one object the daemon asks after every evaluation and training scalar
- ``early_stop.py``, ``health.py``, ``lr_advisor.py``: the three policies
- ``trend.py``: the one min/max rule and the one train-loss trend
- ``paired.py``: two steps on the same documents: paired difference, bootstrap interval, McNemar, MDE
- ``monitor_targets.py``: what ``--monitor`` may name (``SUITE/TASK/METRIC``), refused at start-up otherwise

May import: config, contracts, pipeline (only ``pipeline.metrics``: the names of standard-error tags).
"""
