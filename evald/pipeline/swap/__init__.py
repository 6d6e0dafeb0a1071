"""Put a checkpoint's weights into the compiled network's memory, and prove which weights are there.

- ``weights.py``, ``hot_swap.py``: read each file straight into the parameters' memory (no recompile)
- ``name_fit.py``: fit a checkpoint's parameter names to the network's, saying what differs
- ``dtypes.py``: the one rule for a checkpoint dtype that is not the network's (same kind converts, other kinds refused)
- ``training_state.py``: which entries of a foreign training checkpoint are optimizer state, not weights
- ``tp_load.py``: a tensor-parallel eval rank's slices from any stored layout, only their bytes
- ``slice_merge.py``: whole parameters from tensor-parallel slices, with MindSpore's own tools
- ``swap_check.py``: after a swap, the network holds exactly the checkpoint's weights
- ``provenance.py``: which weights, samples and settings produced a point

May import: config, contracts, files; nothing else of evald.pipeline.
"""
