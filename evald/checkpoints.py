"""What counts as a checkpoint in the watched directory, and how its weights are read.

Two kinds:

* ``evald``: a committed ``step_<N>/`` directory of the layout contract
  (evald.contracts.layout). Its weights are verified (size, sha256) before use.
* ``foreign``: a ``.ckpt`` or ``.safetensors`` file written by MindSpore's
  own ``ModelCheckpoint`` (or ``save_checkpoint``), found with no
  notification. Its global step comes from, in order:
    1. the name ``PREFIX-1_S.ckpt``: in epoch 1 the step within the epoch, S,
       is the global step (no need to read the file);
    2. a ``step_num`` entry in the file (``CheckpointConfig(append_info=["step_num"])``);
    3. the name ``PREFIX-E_S.ckpt`` with ``--foreign-steps-per-epoch``:
       ``(E-1) * steps_per_epoch + S``;
    4. otherwise the file is failed with a reason saying which option to set.
  Only network weights are kept: entries that match no network parameter
  (optimizer moments, step counters) are dropped; names match exactly or after
  one common dotted prefix (``network.model.w`` -> ``model.w``), the prefix
  covering the most parameters, shortest on a tie (so ``adam_m.model.w`` loses).

MindSpore writes ``x.tmp`` and renames it, so a final name is complete; for
other writers a foreign file must also have kept its size and mtime for
``foreign_settle_s`` before it is read.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np

from evald.contracts import layout

EVALD, FOREIGN = "evald", "foreign"
FOREIGN_SUFFIXES = (".ckpt", ".safetensors")
_MODEL_CHECKPOINT_NAME = re.compile(r"^(?P<prefix>.+)-(?P<epoch>\d+)_(?P<step>\d+)\.(ckpt|safetensors)$")
_STEP_KEYS = ("step_num", "cur_step_num", "global_step")


class CheckpointError(RuntimeError):
    """A checkpoint cannot be evaluated; the message says why and is recorded in the ledger."""


class CheckpointDeleted(CheckpointError):
    """The checkpoint disappeared (the trainer's cleanup, a user) before evald could read it."""


@dataclass(frozen=True)
class Candidate:
    key: str                 # name inside the checkpoint directory; the ledger key
    step: int
    kind: str
    path: Path
    run_id: str | None = None
    commit_time: float | None = None


def candidate_for(path: Path, *, steps_per_epoch: int | None = None, settle_s: float = 0.0,
                  now: float | None = None) -> Candidate | str | None:
    """A Candidate for ``path``; a reason string if it is a checkpoint evald cannot use;
    None if it is not (yet) a checkpoint (temp names, unsettled files, other files)."""
    name = path.name
    if layout.is_temp_name(name) or name == layout.EVALD_SUBDIR or name == layout.RUN_FILE:
        return None
    step = layout.parse_step_dir_name(name)
    if step is not None:
        if not (path / layout.MANIFEST_FILE).is_file():
            return None  # not committed by our protocol
        try:
            manifest = layout.read_manifest(path)
        except layout.LayoutError as exc:
            return str(exc)
        return Candidate(name, manifest.step, EVALD, path, manifest.run_id, manifest.commit_time)
    if not name.endswith(FOREIGN_SUFFIXES):
        return None
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    if (now or time.time()) - st.st_mtime < settle_s:
        return None  # still changing, maybe a writer without temp+rename
    step_or_reason = foreign_step(path, steps_per_epoch)
    if isinstance(step_or_reason, str):
        return step_or_reason
    return Candidate(name, step_or_reason, FOREIGN, path, None, st.st_mtime)


def foreign_step(path: Path, steps_per_epoch: int | None) -> int | str:
    match = _MODEL_CHECKPOINT_NAME.match(path.name)
    if match and int(match.group("epoch")) == 1:
        return int(match.group("step"))
    try:
        step = _step_from_contents(path)
    except CheckpointError as exc:
        return str(exc)
    if step is not None:
        return step
    if match and steps_per_epoch:
        return (int(match.group("epoch")) - 1) * steps_per_epoch + int(match.group("step"))
    if match:
        return (f"{path.name}: epoch {match.group('epoch')} step-in-epoch {match.group('step')} cannot be "
                f"turned into a global step; pass --foreign-steps-per-epoch, or save with "
                f"CheckpointConfig(append_info=['step_num'])")
    return (f"{path.name}: no step in the name (PREFIX-EPOCH_STEP.ckpt) or in the contents (step_num); "
            f"rename it or save with CheckpointConfig(append_info=['step_num'])")


def _step_from_contents(path: Path) -> int | None:
    try:
        weights = _load_foreign(path, choice=lambda name: name in _STEP_KEYS)
    except CheckpointError as exc:
        # Fix (issue 3): MindSpore raises "The loaded parameter dict is empty after filter" both for
        # an empty file and for a readable file that merely has no step entry (no append_info).
        # Only the empty file is an error; the other falls through to the name rules.
        if "empty after filter" in str(exc.__cause__) and path.stat().st_size > 0:
            return None
        raise
    for key in _STEP_KEYS:
        if key in weights:
            return int(np.asarray(weights[key]).reshape(-1)[0])
    return None


def _load_foreign(path: Path, choice=None) -> dict[str, np.ndarray]:
    import mindspore as ms

    fmt = "safetensors" if path.suffix == ".safetensors" else "ckpt"
    try:
        params = ms.load_checkpoint(str(path), format=fmt, choice_func=choice)
    except (ValueError, RuntimeError, OSError) as exc:
        raise CheckpointError(f"{path.name}: MindSpore cannot read it ({str(exc).splitlines()[0][:300]}); "
                              f"truncated, empty or corrupt") from exc
    return {name: p.asnumpy() for name, p in params.items()}


def load_weights(candidate: Candidate) -> dict[str, np.ndarray]:
    """Host arrays of a candidate's weights; CheckpointError says what is wrong with the file."""
    if not candidate.path.exists():
        raise CheckpointDeleted(f"{candidate.key}: deleted before it could be evaluated")
    if candidate.kind == FOREIGN:
        return _load_foreign(candidate.path)
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    try:
        manifest = layout.read_manifest(candidate.path)
        weights_path = layout.verify_weights(candidate.path, manifest)
    except layout.LayoutError as exc:
        if not candidate.path.exists():
            raise CheckpointDeleted(f"{candidate.key}: deleted before it could be evaluated") from exc
        raise CheckpointError(str(exc)) from exc
    try:
        return load_file(str(weights_path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{weights_path}: not a readable safetensors file ({exc})") from exc


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
