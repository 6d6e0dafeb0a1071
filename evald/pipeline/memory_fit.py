"""Whether an eval rank's weights fit the device memory MindSpore reports: refused before compiling,
with the arithmetic, when they cannot (docs/eval-group.md, "Which models fit").

MindSpore reports a device's memory through ``mindspore.hal.get_device_properties(id, target)``
(``total_memory``) on Ascend and GPU; on CPU it reports nothing (it returns None), so there is
nothing to check and nothing is refused. The rule is deliberately loose: only the weights are
counted, against ``USABLE`` of the device's memory, because an evaluation also needs activations,
the logits of a batch and the runtime's own memory, which evald cannot know before compiling. A
network refused here cannot run; one accepted may still run out of memory, and then fails as usual.
"""

from __future__ import annotations

import logging

log = logging.getLogger("evald.pipeline.memory_fit")

USABLE = 0.9          # of the device's total memory, for the weights at most
GB = 1e9


def device_memory(device_target: str, device_id: int) -> int | None:
    """Total bytes of the device as MindSpore reports them; None where it reports nothing (CPU)."""
    import mindspore as ms

    try:
        props = ms.hal.get_device_properties(device_id, device_target)
    except (RuntimeError, ValueError, TypeError) as exc:  # a backend without the query
        log.debug("MindSpore does not report %s:%d's memory (%s)", device_target, device_id, exc)
        return None
    total = None if props is None else getattr(props, "total_memory", None)  # MindSpore's own object
    return int(total) if total else None


def fit_problem(weight_bytes: int, capacity: int | None, *, degree: int = 1, device: str = "the device"
                ) -> str | None:
    """Why ``weight_bytes`` of one rank's weights cannot fit ``capacity`` bytes, with the arithmetic; or None."""
    if capacity is None or weight_bytes <= USABLE * capacity:
        return None
    whole = weight_bytes * degree
    need = -(-whole // int(USABLE * capacity))  # ceil: the smallest degree whose share fits
    if degree > 1:
        what = f"each of the {degree} tensor-parallel ranks holds {weight_bytes / GB:.1f} GB of weights"
    else:
        what = f"the evaluation network holds {weight_bytes / GB:.1f} GB of weights"
    return (f"{what}, more than {USABLE:.0%} of {device}'s {capacity / GB:.1f} GB "
            f"({USABLE * capacity / GB:.1f} GB), before activations: it cannot fit. "
            f"{whole / GB:.1f} GB of weights need a tensor-parallel degree of at least {need} on such devices "
            f"(--device with that many ids and --tensor-parallel {need}; docs/eval-group.md, 'Which models fit')")
