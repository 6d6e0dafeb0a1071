"""Copy a network's weights (not its optimizer state) to host memory.

This is the only blocking part of taking a snapshot. On CPU
``Parameter.asnumpy()`` is a view of live memory that the next optimizer step
overwrites, so every array is copied.
"""

from __future__ import annotations

import numpy as np


def weight_parameters(cell, optimizer=None) -> list[tuple[str, object]]:
    """The parameters of ``cell`` that a weights-only checkpoint holds.

    ``cell`` may be a bare network or a train network that contains the
    optimizer; the optimizer's state (moments, step counters, learning rate)
    is left out, the weights it optimizes and non-trainable buffers (e.g.
    BatchNorm statistics) are kept.
    """
    # Names relative to `cell` (not Parameter.name, which wrapper cells such as a
    # loss cell rename with their own prefix), so they match the bare network evald builds.
    named = list(cell.parameters_and_names())
    if optimizer is None:
        return named
    optimized = {id(p) for p in optimizer.parameters}
    state = {id(p) for p in optimizer.get_parameters()} - optimized
    return [(name, p) for name, p in named if id(p) not in state]


def host_copy_of_weights(cell, optimizer=None) -> dict[str, np.ndarray]:
    """``{parameter name: independent numpy copy}`` of the weights of ``cell``."""
    return {name: np.array(p.asnumpy(), copy=True) for name, p in weight_parameters(cell, optimizer)}
