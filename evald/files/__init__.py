"""What a checkpoint file is and how to read it safely. Every read stays inside the
checkpoint directory and is bounded (docs/security.md).

- ``recognise.py``: which entries are checkpoints of which step, of which kind
- ``confine.py``, ``access.py``: no read through a link or of a swapped entry; readable or not
- ``foreign.py``: MindSpore's own ``.ckpt``/``.safetensors`` files read into host arrays
- ``mindformers.py``: MindFormers' output directory: its entries, kinds and steps
- ``checkpoint2.py``: MindFormers' Checkpoint 2.0 iterations: committed or not, their model shards read
- ``slices.py``: an eval rank's slice of a parameter from stored pieces of any layout, only its bytes
- ``parts.py``: the parts of a partitioned snapshot: wait for all, check that they fit
- ``errors.py``: why a checkpoint cannot be evaluated
- ``ownership.py``: the one trust rule for a file evald runs as code (owner, who else may write it)

May import: contracts. (Neither the intake nor the pipeline: both build on this.)
"""
