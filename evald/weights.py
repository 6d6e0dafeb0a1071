"""Reading a checkpoint's weights into the network, and fitting names to the network's.

evald-layout checkpoints are verified against their manifest (sizes, hash) as they are
read (evald.contracts.layout, evald.hot_swap); foreign files are read with MindSpore's own
loader. Every problem is a CheckpointError whose message is recorded in the ledger.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Mapping

import numpy as np

from evald.checkpoints import FOREIGN, PARTS, CheckpointDeleted, CheckpointError
from evald.contracts import layout
from evald.hot_swap import NetworkMismatch, NetworkWeights


def load_into(weights: NetworkWeights, path: Path, kind: str) -> None:
    """Swap the checkpoint at ``path`` into the network; CheckpointError says what is wrong with it.

    evald-layout: the fit is checked from the manifest before a byte is read, then every file is
    read once, verified as it is read, straight into the parameters' memory where it can be.
    Foreign: MindSpore reads the file; the weights are picked out by name and copied in.
    Parts of a partitioned snapshot (``path`` names them all): evald.assembly.
    """
    if kind == PARTS:
        from evald.assembly import load_parts

        return load_parts(weights, path.parent, path.name)
    if not path.exists():
        raise CheckpointDeleted(f"{path.name}: deleted before it could be evaluated")
    if kind == FOREIGN:
        weights.assign(match_names(load_foreign(path), weights.specs, strict=False))
        return
    try:
        weights.load(path, layout.read_manifest(path), strict=True)
    except (layout.LayoutError, NetworkMismatch) as exc:
        if not path.exists():
            raise CheckpointDeleted(f"{path.name}: deleted before it could be evaluated") from exc
        raise CheckpointError(str(exc)) from exc


def load_foreign(path: Path, choice: Callable[[str], bool] | None = None) -> dict[str, np.ndarray]:
    import mindspore as ms

    fmt = "safetensors" if path.suffix == ".safetensors" else "ckpt"
    try:
        params = ms.load_checkpoint(str(path), format=fmt, choice_func=choice)
    except (ValueError, RuntimeError, OSError) as exc:
        raise CheckpointError(f"{path.name}: MindSpore cannot read it ({str(exc).splitlines()[0][:300]}); "
                              f"truncated, empty or corrupt") from exc
    return {name: p.asnumpy() for name, p in params.items()}


def match_names(weights: Mapping[str, np.ndarray], expected: Mapping[str, tuple], *, strict: bool
                ) -> dict[str, np.ndarray]:
    """Map checkpoint entries onto the network's parameter names, or raise naming every problem.

    ``expected`` is ``{name: (shape, dtype)}``. Names match exactly or through
    the one dotted prefix that covers the most parameters (the shortest on a
    tie), never an optimizer moment such as ``adam_m.<prefix>.<name>``. With
    ``strict`` (evald layout) every entry must match; otherwise (foreign files,
    which hold optimizer state too) the others are dropped.
    """
    # Optimizer state is saved as "<state>.<weight name>" ("adam_m.model.w", "adam_v.model.w"),
    # so "model.w", "adam_m.model.w" and "adam_v.model.w" all end with ".w"; picking per entry
    # let the Adam second moments overwrite the real weight. A network's weights share ONE
    # prefix (its path in the saved cell: "" for the bare network, "model." under a loss
    # cell), so choose the prefix that covers the most parameters, the shortest on a tie:
    # optimizer state always adds its own prefix on top, so the weights' prefix is shorter.
    by_prefix: dict[str, dict[str, str]] = {}
    for name in weights:
        parts = name.split(".")
        for i in range(len(parts)):
            suffix = ".".join(parts[i:])
            if suffix in expected:
                by_prefix.setdefault(".".join(parts[:i]), {})[suffix] = name
    best = min(by_prefix, key=lambda prefix: (-len(by_prefix[prefix]), len(prefix)), default=None)
    chosen = by_prefix.get(best, {}) if best is not None else {}
    matched = {target: weights[name] for target, name in chosen.items()}
    unexpected = sorted(set(weights) - set(chosen.values()))
    missing = sorted(set(expected) - set(matched))
    mismatched = [f"{n}: checkpoint {tuple(a.shape)} vs network {tuple(expected[n][0])}"
                  for n, a in matched.items() if tuple(a.shape) != tuple(expected[n][0])]
    problems = []
    if missing:
        problems.append(f"missing parameters {_few(missing)}")
    if strict and unexpected:
        problems.append(f"unexpected parameters {_few(unexpected)}")
    if mismatched:
        problems.append(f"shape mismatch {_few(mismatched)}")
    if problems:
        raise CheckpointError("checkpoint does not fit the evaluation network: " + "; ".join(problems)
                              + " (was it saved from another model or model config?)")
    return matched


def _few(items: list[str], limit: int = 8) -> str:
    shown = ", ".join(items[:limit])
    return f"[{shown}{', …' if len(items) > limit else ''}] ({len(items)})"
