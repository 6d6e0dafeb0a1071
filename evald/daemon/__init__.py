"""evald's lifecycle and the loop for the one checkpoint directory it serves.

- ``server.py``: startup, the tick loop (``Server.on_tick``), shutdown, signal flags, exit codes
- ``run.py``: one directory: routes events to the intake, ticks the sinks, runs one turn at a time
- ``turn.py``: one evaluation turn: the lag policy picks, the pipeline evaluates, one ledger
  transaction records the outcome with its TensorBoard record and the decisions' state
- ``suite_turn.py``: benchmark suites' cells: which are due, newest first, backfill requests, their commit
- ``cell_commit.py``: what an evaluated suite cell commits (metrics, its TensorBoard record and layout,
  provenance), one function for the live loop and a backfill fleet's merge
- ``channels.py``, ``locks.py``: the sockets, each endpoint and directory held by one evald
- ``run_dir.py``, ``private_files.py``: where a run's state lives, and that it stays private
- ``eval_group.py``: several devices: evald started under msrun, one process per device
- ``logs.py``: log lines for people or for log shippers
- ``fleet.py``, ``fleet_cells.py``, ``fleet_merge.py``: a backfill fleet's worker (its share of the plan,
  each snapshot loaded once), the hand-over files it writes (sealed, atomic, read under the one rule),
  and their merge into the ledger, each cell exactly once; ``fleet_key.py``: the run's key that seals
  them; ``fleet_check.py``: a cell checked against the plan and its suite before anything is written
- ``serving.py``: ``--serve``: the HTTP endpoint (evald.serve) started, fed the network, its jobs run
  between evaluation batches and between evaluations

May import: config, contracts, ledger, files, pipeline, decisions, intake, sinks, serve.
"""
