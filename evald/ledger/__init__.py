"""Durable state: steps, files, the TensorBoard outbox and the decisions' state, in sqlite,
one transaction per change (docs/reliability.md).

- ``ledger.py``: the ``Ledger`` and its transactions
- ``schema.py``: the tables, the states and the row types
- ``samples.py``: per-sample benchmark results (compressed JSONL + sidecar): their writer and their one
  reader, validated and bounded (``evald compare``, the paired SE, tests)
- ``skips.py``: the one text of a step that was not evaluated, and its lag
- ``requeue.py``: ``evald retry``, and failures re-queued when the configuration that judged them changed
- ``disk_full.py``: a full disk waits and retries a transaction whole, never crashes

May import: config, contracts.
"""
