"""evald: an asynchronous, out-of-process evaluator for MindSpore training.

Importing this package is cheap (no mindspore, no zmq): the trainer side uses
``evald.contracts`` and must not pay for the evaluator.
"""

__version__ = "0.1.0"
