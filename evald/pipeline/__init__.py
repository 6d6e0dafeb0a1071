"""Build the network once, hot-swap each checkpoint into it, evaluate the fixed subset.

- ``pipeline.py``: the ``Pipeline``: build when the factories are known, evaluate one step,
  say whether it was evaluated, failed (a bad file) or must be retried
- ``network.py``: the network compiled once, its tasks and its subset
- ``subset.py``, ``factories.py``, ``device.py``: the seeded subset, the user's factories, the device
- ``framework_logs.py``: a framework a factory imports (MindFormers) logs its INFO lines to its own files
- ``swap/``: reading a checkpoint's weights into the network's memory, and proving what was read
- ``suites/``: benchmark suites: token scoring, the tokenizer, lm-eval's ``LM``, suites and their identities
- ``group/``: the same evaluation (and a suite's requests) on several devices
- ``tasks/``, ``metrics/``: Graph-mode eval cells and their metrics

May import: config, contracts, ledger, files.
"""
