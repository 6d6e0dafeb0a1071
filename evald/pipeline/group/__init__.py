"""One evaluation on several devices: an msrun eval group (docs/eval-group.md).

- ``protocol.py``: rank 0's commands and every rank's answers, summed through AllReduce
- ``evaluator.py``: the validation on every rank, each taking its share of the fixed subset
- ``scoring.py``: a suite's requests split over the ranks, with one rank's numbers bit for bit

May import: config, contracts, files; within evald.pipeline: engine, network, tasks.
"""
