"""What an entry of the checkpoint directory is: a checkpoint of some step, or not.

Two kinds of checkpoint:

* ``evald``: a committed ``step_<N>/`` directory of the layout contract
  (evald.contracts.layout); its step is in its name and must equal its manifest's.
* ``part``: one committed part ``step_<N>-part-<i>-of-<n>/`` of a partitioned snapshot;
  evald.assembly waits for all ``n`` and the step is then read from all of them (``parts``).
* ``foreign``: a ``.ckpt`` or ``.safetensors`` file written by MindSpore's own
  ``ModelCheckpoint`` (or ``save_checkpoint``). Its global step comes from, in order:
    1. the name ``PREFIX-1_S.ckpt``: in epoch 1 the step within the epoch, S, is the
       global step (the file is not opened for it);
    2. a ``step_num`` entry in the file (``CheckpointConfig(append_info=["step_num"])``);
    3. the name ``PREFIX-E_S.ckpt`` with ``--foreign-steps-per-epoch``: ``(E-1)*N + S``;
    4. otherwise the file is rejected with a reason saying which option to set.

One training step gets one evaluation whichever files carry it (docs/reliability.md,
"Which file a step is read from"): an evald-layout checkpoint wins over a foreign file
of the same step, because it is verified (sizes and hash) and holds the weights only.
A link inside the directory to another entry is a duplicate of that entry; a link that
leads outside the directory is rejected.

MindSpore writes ``x.tmp`` and renames it, so a final name is complete; for other
writers a foreign file must also have kept its size and mtime for ``settle_s``.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from evald.contracts import layout
from evald.contracts.partition import parse_part_dir_name

EVALD, FOREIGN = "evald", "foreign"
PART, PARTS = "part", "parts"  # one part of a partitioned snapshot; a step read from all its parts
FOREIGN_SUFFIXES = (".ckpt", ".safetensors")
PREFERENCE = {EVALD: 0, PARTS: 0, FOREIGN: 1}  # lower wins when several files carry one step
_MODEL_CHECKPOINT_NAME = re.compile(r"^(?P<prefix>.+)-(?P<epoch>\d{1,9})_(?P<step>\d{1,15})\.(ckpt|safetensors)$")
_STEP_KEYS = ("step_num", "cur_step_num", "global_step")
MAX_STEP = 2**63 - 1


class CheckpointError(RuntimeError):
    """A checkpoint cannot be evaluated; the message says why and is recorded in the ledger."""


class CheckpointDeleted(CheckpointError):
    """The checkpoint disappeared (the trainer's cleanup, a user) before evald could read it."""


@dataclass(frozen=True)
class Found:
    name: str                # entry name inside the checkpoint directory
    step: int
    kind: str
    run_id: str | None = None
    commit_time: float | None = None
    manifest: layout.Manifest | None = field(default=None, compare=False, repr=False)  # of a part

    @property
    def preference(self) -> int:
        return PREFERENCE[self.kind]


@dataclass(frozen=True)
class Rejected:
    name: str
    step: int | None
    reason: str
    duplicate: bool = False  # an alias of another entry, not a bad file


def recognise(ckpt_dir: Path, name: str, *, steps_per_epoch: int | None = None, settle_s: float = 0.0,
              now: float | None = None) -> Found | Rejected | None:
    """What entry ``name`` of ``ckpt_dir`` is; None when it is not (yet) a checkpoint."""
    if layout.is_temp_name(name) or name in (layout.EVALD_SUBDIR, layout.RUN_FILE, layout.RUN_END_FILE):
        return None
    path = ckpt_dir / name
    dir_step, part = layout.parse_step_dir_name(name), parse_part_dir_name(name)
    if part is not None:
        dir_step = part[0]
    if dir_step is None and not name.endswith(FOREIGN_SUFFIXES):
        return None
    if dir_step is not None and dir_step > MAX_STEP:
        return Rejected(name, None, f"step {dir_step} in the name is out of range (0..2**63-1)")
    if path.is_symlink():
        return _link(ckpt_dir, path, dir_step)
    if dir_step is not None:
        return _evald(path, dir_step, part)
    return _foreign(path, steps_per_epoch, settle_s, now)


def _link(ckpt_dir: Path, path: Path, step: int | None) -> Rejected:
    target = Path(os.path.realpath(path))
    if target.parent != Path(os.path.realpath(ckpt_dir)):
        return Rejected(path.name, step, f"a link to {target}, outside the checkpoint directory: not read")
    return Rejected(path.name, step, f"a link to {target.name}, which is read under its own name", duplicate=True)


def _evald(path: Path, dir_step: int, part: tuple[int, int, int] | None = None) -> Found | Rejected | None:
    if not (path / layout.MANIFEST_FILE).is_file():
        return None  # not committed by our protocol (or still being renamed into place)
    try:
        manifest = layout.read_manifest(path)
    except layout.LayoutError as exc:
        return Rejected(path.name, dir_step, str(exc))
    if manifest.step != dir_step:
        return Rejected(path.name, dir_step, f"its manifest says step {manifest.step} but the directory is step "
                                             f"{dir_step}: renamed or copied by hand; not evaluated")
    says = manifest.parts and (manifest.step, manifest.parts.index, manifest.parts.count)
    if part is not None or says:
        if says != part:
            return Rejected(path.name, dir_step, f"its manifest says {'part ' + str(says[1:]) if says else 'whole'}"
                                                 f", its name another: renamed or copied by hand; not evaluated")
        return Found(path.name, dir_step, PART, manifest.run_id, manifest.commit_time, manifest)
    return Found(path.name, dir_step, EVALD, manifest.run_id, manifest.commit_time)


def _foreign(path: Path, steps_per_epoch: int | None, settle_s: float, now: float | None
             ) -> Found | Rejected | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    if (now or time.time()) - st.st_mtime < settle_s:
        return None  # still changing, maybe a writer without temp+rename: re-checked later
    step_or_reason = foreign_step(path, steps_per_epoch)
    if isinstance(step_or_reason, str):
        return Rejected(path.name, None, step_or_reason)
    return Found(path.name, step_or_reason, FOREIGN, None, st.st_mtime)


def foreign_step(path: Path, steps_per_epoch: int | None) -> int | str:
    """The global step of a foreign file, or the reason it cannot be known."""
    match = _MODEL_CHECKPOINT_NAME.match(path.name)
    if match and int(match.group("epoch")) == 1:
        return int(match.group("step"))
    try:
        step = _step_from_contents(path)
    except CheckpointError as exc:
        return str(exc)
    if step is not None:
        return step if 0 <= step <= MAX_STEP else f"{path.name}: its step_num {step} is out of range"
    if match and steps_per_epoch:
        return (int(match.group("epoch")) - 1) * steps_per_epoch + int(match.group("step"))
    if match:
        return (f"{path.name}: epoch {match.group('epoch')} step-in-epoch {match.group('step')} cannot be "
                f"turned into a global step; pass --foreign-steps-per-epoch, or save with "
                f"CheckpointConfig(append_info=['step_num'])")
    return (f"{path.name}: no step in the name (PREFIX-EPOCH_STEP.ckpt) or in the contents (step_num); "
            f"rename it or save with CheckpointConfig(append_info=['step_num'])")


def _step_from_contents(path: Path) -> int | None:
    from evald.weights import load_foreign

    try:
        weights = load_foreign(path, choice=lambda name: name in _STEP_KEYS)
    except CheckpointError as exc:
        # MindSpore raises "The loaded parameter dict is empty after filter" both for an empty
        # file and for a readable file with no step entry. Only the empty file is an error.
        if "empty after filter" in str(exc.__cause__) and path.stat().st_size > 0:
            return None
        raise
    for key in _STEP_KEYS:
        if key in weights:
            return int(np.asarray(weights[key]).reshape(-1)[0])
    return None
