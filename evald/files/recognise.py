"""What an entry of the checkpoint directory is: a checkpoint of some step, or not.

Two kinds of checkpoint:

* ``evald``: a committed ``step_<N>/`` directory of the layout contract
  (evald.contracts.layout); its step is in its name and must equal its manifest's.
* ``part``: one committed part ``step_<N>-part-<i>-of-<n>/`` of a partitioned snapshot;
  evald.files.parts waits for all ``n`` and the step is then read from all of them (``parts``).
* ``foreign``: a ``.ckpt`` or ``.safetensors`` file written by MindSpore's own
  ``ModelCheckpoint`` (or ``save_checkpoint``). Its global step comes from, in order:
    1. the name ``PREFIX-1_S.ckpt``: in epoch 1 the step within the epoch, S, is the
       global step (the file is not opened for it);
    2. a ``step_num`` entry in the file (``CheckpointConfig(append_info=["step_num"])``);
       for a MindFormers weights-only file, the full checkpoint of the same epoch and step
       (evald.files.mindformers);
    3. the name ``PREFIX-E_S.ckpt`` with ``--foreign-steps-per-epoch``: ``(E-1)*N + S``;
    4. otherwise the file is rejected with a reason saying which option to set.
  A MindFormers weights-only file (``checkpoint_network/rank_N/``) is of kind
  ``foreign-weights``, preferred to a full checkpoint of the same step.
* ``checkpoint2``: a MindFormers Checkpoint 2.0 ``iteration_XXXXXXXX/`` directory, once MindFormers'
  tracker file commits it (evald.files.checkpoint2); its step is its iteration. Like a weights-only
  file it is read for its model files only.

One training step gets one evaluation whichever files carry it (docs/reliability.md,
"Which file a step is read from"): an evald-layout checkpoint wins over a foreign file
of the same step, because it is verified (sizes and hash) and holds the weights only.
A file evald's user may not read is ``Pending``: judged again later, never rejected for it.
A link inside the directory to another entry is a duplicate of that entry; a link that
leads outside the directory is rejected.

MindSpore writes ``x.tmp`` and renames it, so a final name is complete; for other
writers a foreign file must also have kept its size and mtime for ``settle_s``.
"""

from __future__ import annotations

import functools
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from evald.contracts import layout
from evald.contracts.partition import parse_part_dir_name
from evald.files import checkpoint2
from evald.files import mindformers as mindformers_layout
from evald.files.access import Unreadable, check_readable
from evald.files.confine import confined, examine
from evald.files.errors import CheckpointDeleted, CheckpointError, CheckpointUnreadable
from evald.files.foreign import load_foreign

EVALD, FOREIGN, FOREIGN_WEIGHTS = "evald", "foreign", "foreign-weights"
CHECKPOINT2 = "checkpoint2"  # a MindFormers Checkpoint 2.0 iteration directory
PART, PARTS = "part", "parts"  # one part of a partitioned snapshot; a step read from all its parts
FOREIGN_KINDS = (FOREIGN, FOREIGN_WEIGHTS)
FOREIGN_SUFFIXES = (".ckpt", ".safetensors")
PREFERENCE = {EVALD: 0, PARTS: 0, FOREIGN_WEIGHTS: 1, CHECKPOINT2: 1, FOREIGN: 2}  # lower wins when several files carry one step
_MODEL_CHECKPOINT_NAME = re.compile(  # fullmatch: ASCII digits, no trailing "\n"
    r"(?P<prefix>.+)-(?P<epoch>[0-9]{1,9})_(?P<step>[0-9]{1,15})\.(ckpt|safetensors)", re.DOTALL)
_STEP_KEYS = ("step_num", "cur_step_num", "global_step")
MAX_STEP = 2**63 - 1


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


@dataclass(frozen=True)
class Pending:
    name: str
    reason: str              # why evald cannot judge it now (a permission problem): judged again later


def recognise(ckpt_dir: Path, name: str, *, steps_per_epoch: int | None = None, settle_s: float = 0.0,
              now: float | None = None) -> Found | Rejected | Pending | None:
    """What entry ``name`` of ``ckpt_dir`` is; None when it is not (yet) a checkpoint."""
    if (layout.is_temp_name(mindformers_layout.base_name(name))
            or name in (layout.EVALD_SUBDIR, layout.RUN_FILE, layout.RUN_END_FILE)):
        return None
    path = ckpt_dir / name
    iteration = mindformers_layout.is_iteration_name(name)
    dir_step, part = layout.parse_step_dir_name(name), parse_part_dir_name(name)
    if part is not None:
        dir_step = part[0]
    if dir_step is None and not iteration and not name.endswith(FOREIGN_SUFFIXES):
        return None
    if not os.path.lexists(path):
        return None  # before any verdict: a notice of an entry that does not exist leaves no row
    if dir_step is not None and dir_step > MAX_STEP:
        return Rejected(name, None, f"step {dir_step} in the name is out of range (0..2**63-1)")
    if "/" in name and os.path.realpath(path.parent) != os.path.join(os.path.realpath(ckpt_dir), os.path.dirname(name)):
        return Rejected(name, None, f"{os.path.dirname(name)} is a link: a served subdirectory must be a real "
                                    f"directory inside the checkpoint directory; not read")
    if path.is_symlink():
        return _link(path.parent, path, dir_step, name)
    if iteration:
        return _checkpoint2(ckpt_dir, path, name)
    if dir_step is not None:
        return _evald(path, dir_step, part)
    return _foreign(path, name, steps_per_epoch, settle_s, now)


def _link(ckpt_dir: Path, path: Path, step: int | None, name: str) -> Rejected:
    target = Path(os.path.realpath(path))
    if target.parent != Path(os.path.realpath(ckpt_dir)):  # named as the link says: nothing of the target leaks
        return Rejected(name, step, f"a link to {_link_text(path)}, outside the checkpoint directory: not read")
    return Rejected(name, step, f"a link to {target.name!r}, which is read under its own name", duplicate=True)


def _evald(path: Path, dir_step: int, part: tuple[int, int, int] | None = None) -> Found | Rejected | None:
    if not os.path.lexists(path / layout.MANIFEST_FILE):
        return None  # not committed by our protocol (or still being renamed into place)
    try:
        with confined(path.parent, path.name, directory=True):
            manifest = layout.read_manifest(path)
    except (layout.LayoutError, CheckpointError) as exc:
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


def _checkpoint2(ckpt_dir: Path, path: Path, name: str) -> Found | Rejected | Pending | None:
    if not path.is_dir():
        return Rejected(name, None, "not a directory: MindFormers' iteration_XXXXXXXX entries are directories")
    try:  # every file below the served directory, none reached through a link (evald.contracts.safe_open)
        step_or_reason = checkpoint2.committed(path, root=ckpt_dir)
    except CheckpointUnreadable as exc:
        return Pending(name, str(exc))
    except CheckpointError as exc:
        return Rejected(name, checkpoint2.iteration_of(path.name), str(exc))
    if step_or_reason is None:
        return None  # not committed by MindFormers' tracker yet: judged again when it changes
    if isinstance(step_or_reason, str):
        return Rejected(name, checkpoint2.iteration_of(path.name), step_or_reason)
    if step_or_reason > MAX_STEP:
        return Rejected(name, None, f"iteration {step_or_reason} is out of range (0..2**63-1)")
    return Found(name, step_or_reason, CHECKPOINT2, None, path.stat().st_mtime)


def _foreign(path: Path, name: str, steps_per_epoch: int | None, settle_s: float, now: float | None
             ) -> Found | Rejected | Pending | None:
    try:
        st = examine(path.parent, path.name, directory=False)
    except CheckpointDeleted:
        return None
    except CheckpointError as exc:
        return Rejected(name, None, str(exc))  # a FIFO, a device, a directory: never opened
    if (now or time.time()) - st.st_mtime < settle_s:
        return None  # still changing, maybe a writer without temp+rename: re-checked later
    try:
        check_readable(path, name)
        step_or_reason = foreign_step(path, steps_per_epoch, now=now)
    except (Unreadable, CheckpointUnreadable) as exc:
        return Pending(name, str(exc))
    if step_or_reason is None:
        return None  # a MindFormers weights-only file whose full checkpoint is not there yet
    if isinstance(step_or_reason, str):
        return Rejected(name, None, step_or_reason)
    kind = FOREIGN_WEIGHTS if mindformers_layout.is_weights_only(path) else FOREIGN
    return Found(name, step_or_reason, kind, None, st.st_mtime)


def foreign_step(path: Path, steps_per_epoch: int | None, *, now: float | None = None) -> int | str | None:
    """The global step of a foreign file, or the reason it cannot be known; None: not known yet.

    Raises CheckpointUnreadable when a file it must read is not readable by evald's user.
    """
    match = _MODEL_CHECKPOINT_NAME.fullmatch(path.name)
    if match and int(match.group("epoch")) == 1:
        return int(match.group("step"))
    weights_only = mindformers_layout.is_weights_only(path)
    try:  # MindFormers saves no step in a weights-only file: the full checkpoint of its step has it
        step = (mindformers_layout.step_of_weights_only(path, _step_from_contents, now=now) if weights_only
                else _step_from_contents(path))
    except CheckpointUnreadable:
        raise
    except CheckpointError as exc:
        return str(exc)
    if step is mindformers_layout.WAIT:
        return None
    if isinstance(step, str) and not steps_per_epoch:  # a weights-only file whose full checkpoint is gone
        return (f"{path.name}: epoch {match.group('epoch')} step-in-epoch {match.group('step')} cannot be turned "
                f"into a global step: {step}; pass --foreign-steps-per-epoch")
    if isinstance(step, str):
        step = None  # --foreign-steps-per-epoch below
    if step is not None:
        return step if 0 <= step <= MAX_STEP else f"{path.name}: its step_num {step} is out of range"
    if match and steps_per_epoch:
        step = (int(match.group("epoch")) - 1) * steps_per_epoch + int(match.group("step"))
        return step if 0 <= step <= MAX_STEP else f"{path.name}: step {step} (from its name) is out of range"
    if match:
        return (f"{path.name}: epoch {match.group('epoch')} step-in-epoch {match.group('step')} cannot be "
                f"turned into a global step; pass --foreign-steps-per-epoch, or save with "
                f"CheckpointConfig(append_info=['step_num'])")
    return (f"{path.name}: no step in the name (PREFIX-EPOCH_STEP.ckpt) or in the contents (step_num); "
            f"rename it or save with CheckpointConfig(append_info=['step_num'])")


def _step_from_contents(path: Path) -> int | None:
    try:  # cached: a MindFormers full checkpoint is read for its own step and for its weights file's
        st = path.stat()
    except FileNotFoundError as exc:
        raise CheckpointError(f"{path.name}: deleted while evald was reading it") from exc
    return _cached_step_from_contents(str(path), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _cached_step_from_contents(path_text: str, _size: int, _mtime_ns: int) -> int | None:
    path = Path(path_text)
    try:
        weights = load_foreign(path, choice=lambda name: name in _STEP_KEYS)  # confined, size-checked
    except CheckpointError as exc:
        # MindSpore raises "The loaded parameter dict is empty after filter" both for an empty
        # file and for a readable file with no step entry. Only the empty file is an error.
        if "empty after filter" in str(exc.__cause__) and path.stat().st_size > 0:
            return None
        raise
    for key in _STEP_KEYS:
        if key in weights:
            return _as_step(path, key, weights[key])
    return None


def _as_step(path: Path, key: str, value) -> int:
    """A step entry's one integral value (the file decides its dtype and shape: NaN, [], "x")."""
    array = np.asarray(value).reshape(-1)
    if array.size != 1 or array.dtype.kind not in "iuf" or not np.isfinite(array[0]) or array[0] != int(array[0]):
        raise CheckpointError(f"{path.name}: its {key} entry ({array.dtype}{list(np.shape(value))}) is not one "
                              f"integral step")
    return int(array[0])


def _link_text(path: Path) -> str:
    try:
        return repr(os.readlink(path))
    except OSError:
        return "(unreadable)"
def step_from_name(name: str, steps_per_epoch: int | None) -> int | None:
    """The global step a ``PREFIX-E_S.ckpt`` name gives without opening the file (rules 1 and 3), else None."""
    match = _MODEL_CHECKPOINT_NAME.fullmatch(name)
    if match is None:
        return None
    epoch, step = int(match.group("epoch")), int(match.group("step"))
    if epoch == 1:
        return step
    return (epoch - 1) * steps_per_epoch + step if steps_per_epoch else None
