"""Build the network once, hot-swap each checkpoint into it, evaluate the fixed subset.

- ``pipeline.py``: the ``Pipeline``: build when the factories are known, evaluate one step,
  say whether it was evaluated, failed (a bad file) or must be retried
- ``seam.py``: the typed seam the daemon calls (the pipeline's protocols) and the outcomes it gets back
- ``suite_host.py``: ``SuiteHost``: a suite's life (planned, built a piece a turn, refused, evaluated)
- ``network.py``: the network compiled once, its tasks and its subset
- ``subset.py``, ``factories.py``, ``device.py``: the seeded subset, the user's factories, the device
- ``framework_logs.py``: a framework a factory imports (MindFormers) logs its INFO lines to its own files
- ``swap/``: reading a checkpoint's weights into the network's memory, and proving what was read
- ``engine/``: the scoring engine below its clients (suites, group, evald.serve): token log-probabilities and
  greedy generation in fixed shape buckets; it imports none of them
- ``suites/``: benchmark suites: the tokenizer, lm-eval's ``LM``, suites and their identities
- ``group/``: the same evaluation (and a suite's requests) on several devices
- ``tasks/``, ``metrics/``: Graph-mode eval cells and their metrics

May import: config, contracts, ledger, files.
"""
