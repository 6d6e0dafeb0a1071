"""Events become ledger rows, once: the directory's entries and the trainer's messages.

- ``discovery.py`` (watchdog and rescans), ``mounts.py`` (which filesystems need polling),
  ``receiver.py`` (the ZeroMQ PULL thread): where events come from
- ``intake.py``: an entry is judged once, a step gets one row, the lag policy admits or skips it
- ``lag_policy.py``: which queued steps to evaluate or skip when evald falls behind
- ``trainer_files.py``: the trainer's RUN.json and RUN_END.json
- ``trust.py``: what a message or file may make evald do (docs/security.md)
- ``train_stream.py``: training scalars become health alerts and TensorBoard records

May import: config, contracts, ledger, files, decisions.
"""
