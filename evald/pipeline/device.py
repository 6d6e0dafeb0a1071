"""Pick the backend and device evald runs on (``--device 7 --device-target auto``)."""

from __future__ import annotations

import logging

log = logging.getLogger("evald.pipeline.device")


def detect_target() -> str:
    """The first of Ascend, GPU, CPU that this MindSpore build can use here."""
    import mindspore as ms

    for target in ("Ascend", "GPU"):
        try:
            if ms.hal.is_available(target):
                return target
        except Exception:  # a backend plugin that cannot even be probed is not available
            continue
    return "CPU"


def select_device(target: str, device_id: int) -> str:
    import mindspore as ms

    chosen = detect_target() if target == "auto" else target
    ms.set_device(chosen, device_id)
    ms.set_context(mode=ms.GRAPH_MODE)
    log.info("evaluating on %s device %d in GRAPH_MODE", chosen, device_id)
    return chosen
