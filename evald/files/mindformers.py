"""MindFormers' checkpoint layout: which of its files evald serves, under which names, and their steps.

MindFormers' ``CheckpointMonitor`` (mindformers 2.0) writes under its output directory::

    checkpoint/rank_N/<prefix>_rank_N-<epoch>_<step>.ckpt        weights, optimizer state (adam_m.*,
                                                                  adam_v.*, loss-scale state) and
                                                                  step_num, global_step, epoch_num
    checkpoint/rank_N/meta.json                                   {"last_epoch", "last_step", "last_ckpt_file"}
    checkpoint_network/rank_N/<prefix>_rank_N-network-<epoch>_<step>.ckpt    the weights only

(``.safetensors`` instead with ``checkpoint_format: safetensors``), every file read-only
for its owner (0400, MindSpore's ``save_checkpoint`` does that), directories 0750.

``evald --ckpt-dir OUTPUT`` serves OUTPUT's own entries (evald's ``step_N/``, foreign
files) and rank 0's two MindFormers directories; their entries are named by their path
relative to OUTPUT (``checkpoint_network/rank_0/llama_rank_0-network-1_10.ckpt``), in the
ledger and in ``best.json``. Rank 0 only: with data parallelism every rank saves the same
weights. A weights-only file (kind ``foreign-weights``) is preferred to the full checkpoint
of the same step (docs/reliability.md, "Which file a step is read from"); ``meta.json`` is
not a checkpoint and is ignored. evald creates nothing there: each directory is watched
once it exists.

Checkpoint 2.0 (MindFormers 2.0's default, evald.files.checkpoint2): its iteration directories
``checkpoint/iteration_XXXXXXXX/`` are entries too (``ITERATIONS_DIR``), named so
(``checkpoint/iteration_00000020``); and when ``--ckpt-dir`` is that ``checkpoint`` directory itself,
plain ``iteration_00000020``. The tracker file ``latest_checkpointed_iteration.txt`` next to them is
what commits them: a change to it makes evald look at the iterations again (``is_tracker``). It is read
only as a small regular file of that directory (a link or a FIFO there is refused, never followed or
waited on), and it commits an iteration only once that iteration is complete (evald.files.checkpoint2).

The step of a weights-only file of epoch 2 and later: its name carries the step within
the epoch only and the file holds weights only, but the full checkpoint of the same epoch
and step, ``checkpoint/rank_N/<prefix>_rank_N-<epoch>_<step>``, holds ``step_num`` and
``global_step``. (``meta.json`` names the newest full file by the same epoch and
step-in-epoch, so it adds nothing.) The same rule works for ``--ckpt-dir
OUTPUT/checkpoint_network/rank_0``: the full file is found from the weights file's path.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Callable

from evald.files.checkpoint2 import TRACKER, iteration_of

WEIGHTS_DIR, FULL_DIR = "checkpoint_network", "checkpoint"
RANK_DIR = "rank_0"
SERVED = (f"{WEIGHTS_DIR}/{RANK_DIR}", f"{FULL_DIR}/{RANK_DIR}")  # weights first: rescans list them first
ITERATIONS_DIR = FULL_DIR  # Checkpoint 2.0's iteration_XXXXXXXX/ directories and its tracker file
# A weights-only file found before the full checkpoint of its step (async saving) waits this long for it.
SIBLING_WAIT_S = 60.0


class _Wait:
    def __repr__(self) -> str:
        return "WAIT"


WAIT = _Wait()  # step_of_weights_only: not known yet, look again later

_RANK = re.compile(r"rank_[0-9]{1,6}")  # fullmatch: ASCII digits, no trailing "\n"
_NETWORK_NAME = re.compile(
    r"(?P<prefix>.+)-network-(?P<epoch>[0-9]{1,9})_(?P<step>[0-9]{1,15})\.(?P<ext>ckpt|safetensors)", re.DOTALL)


def served_dirs(ckpt_dir: Path) -> list[Path]:
    """MindFormers' directories whose files are entries of the served directory ``ckpt_dir``."""
    return [Path(ckpt_dir) / sub for sub in (*SERVED, ITERATIONS_DIR)]


def is_iteration_name(name: str) -> bool:
    """An entry name of a Checkpoint 2.0 iteration directory: ``[checkpoint/]iteration_XXXXXXXX``."""
    head, _, base = name.rpartition("/")
    return head in ("", ITERATIONS_DIR) and iteration_of(base) is not None


def is_tracker(ckpt_dir: Path, path: Path) -> bool:
    """Checkpoint 2.0's ``latest_checkpointed_iteration.txt`` of the served directory (it commits iterations)."""
    path = Path(path)
    return path.name == TRACKER and path.parent in (Path(ckpt_dir), Path(ckpt_dir) / ITERATIONS_DIR)


def watched_dirs(ckpt_dir: Path) -> list[Path]:
    """The served directories and the ones between them and ``ckpt_dir`` (to learn when they appear)."""
    ckpt_dir = Path(ckpt_dir)
    dirs: list[Path] = []
    for sub in SERVED:
        top = ckpt_dir / sub.split("/")[0]
        dirs += [d for d in (top, ckpt_dir / sub) if d not in dirs]
    return dirs


def output_dir_of(ckpt_dir: Path) -> Path:
    """The MindFormers output directory when ``ckpt_dir`` is one of its rank directories, else ``ckpt_dir``."""
    ckpt_dir = Path(ckpt_dir)
    if _RANK.fullmatch(ckpt_dir.name) and ckpt_dir.parent.name in (WEIGHTS_DIR, FULL_DIR):
        return ckpt_dir.parent.parent
    return ckpt_dir


def entry_name(ckpt_dir: Path, path: Path) -> str | None:
    """``path``'s name as an entry of the served directory, or None if it is not one."""
    parent = Path(path).parent
    if parent == Path(ckpt_dir):
        return Path(path).name
    for sub in SERVED:
        if parent == Path(ckpt_dir) / sub:
            return f"{sub}/{Path(path).name}"
    if parent == Path(ckpt_dir) / ITERATIONS_DIR and iteration_of(Path(path).name) is not None:
        return f"{ITERATIONS_DIR}/{Path(path).name}"
    return None


def is_entry_name(name: str) -> bool:
    """True for a name ``entry_name`` gives: a plain name, or a served MindFormers directory and a plain name.

    Names also arrive in ZeroMQ messages, so anything else (``../x``, ``a/b/c``) is refused here.
    """
    head, _, base = name.rpartition("/")
    return bool(base) and base not in (".", "..") and (head == "" or head in SERVED or is_iteration_name(name))


def base_name(name: str) -> str:
    return name.rpartition("/")[2]


def is_weights_only(path: Path) -> bool:
    """A MindFormers weights-only checkpoint: ``.../checkpoint_network/rank_N/<prefix>-network-E_S.ckpt``."""
    path = Path(path)
    return (path.parent.parent.name == WEIGHTS_DIR and bool(_RANK.fullmatch(path.parent.name))
            and bool(_NETWORK_NAME.fullmatch(path.name)))


def full_sibling(path: Path) -> Path | None:
    """The full checkpoint MindFormers wrote at the same epoch and step as the weights-only file ``path``."""
    path = Path(path)
    match = _NETWORK_NAME.fullmatch(path.name)
    if match is None or not is_weights_only(path):
        return None
    name = f"{match['prefix']}-{match['epoch']}_{match['step']}.{match['ext']}"
    return path.parent.parent.parent / FULL_DIR / path.parent.name / name


def step_of_weights_only(path: Path, step_in_file: Callable[[Path], int | None], *,
                         now: float | None = None) -> int | str | _Wait | None:
    """The global step of the weights-only file ``path`` from the full checkpoint of its step.

    Returns the step; None when the full checkpoint is there but holds no step (the
    caller's other rules apply); ``WAIT`` while it is not there yet and ``path`` is
    younger than SIBLING_WAIT_S; otherwise a reason. ``step_in_file`` reads the
    ``step_num``/``global_step`` of a checkpoint (it may raise CheckpointError).
    """
    sibling = full_sibling(path)
    if sibling is None:
        return None
    try:
        sibling.stat()
    except FileNotFoundError:
        try:
            young = (now or time.time()) - Path(path).stat().st_mtime < SIBLING_WAIT_S
        except FileNotFoundError:
            young = False
        if young:
            return WAIT
        return (f"the full checkpoint of the same step, {FULL_DIR}/{sibling.parent.name}/{sibling.name}, which "
                f"holds its global step, is not there")
    return step_in_file(sibling)
