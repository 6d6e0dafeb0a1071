"""evald: an asynchronous, out-of-process evaluator for MindSpore training.

One package per stage, each importing only the packages below it (tests/unit/test_architecture.py
keeps it so)::

    cli        the evald command and its subcommands
    daemon     lifecycle and the per-directory loop
    serve      --serve: the OpenAI-compatible HTTP endpoint on the live checkpoint
    sinks      write what the ledger committed: TensorBoard, control channel, best pointer, summary
    intake     entries and messages become ledger rows, once
    decisions  early stop, health, LR advice: no I/O
    pipeline   build once, hot-swap, evaluate
    files      what a checkpoint file is and how to read it safely
    ledger     durable state, one transaction per change
    config     every option once, one validator
    contracts  the trainer <-> evald contract (the only code trainer_hooks imports)

Importing this package is cheap (no mindspore, no zmq): the trainer side uses
``evald.contracts`` and must not pay for the evaluator.
"""

__version__ = "0.1.0"
