"""Issue 19, "also required": a generated-filesystem property test. Over random checkpoint trees
(links out, link loops, links to /dev/zero, sparse 1 TiB files, hard links out, FIFOs, bad and linked
manifests, files of another uid, modes 000 and 777, Unicode-digit, newline and non-UTF-8 names),
evald's intake and recognition never raise, never open a file outside the tree, leave at most one
``files`` row per real entry (and none for a notice of an absent one), and a read of what was found
never reads more than its tensors and a header (no sparse "rest")."""

from __future__ import annotations

import builtins
import dataclasses
import io
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evald.config import EvaldConfig
from evald.contracts import layout
from evald.contracts import safetensors_io as sio
from evald.files.confine import confined
from evald.files.errors import CheckpointError
from evald.files.recognise import EVALD
from evald.intake import trainer_files
from evald.intake.intake import Intake
from evald.ledger.ledger import Ledger
from tests import hostile_trees
from tests.hostile_trees import KINDS, Entry

pytestmark = pytest.mark.skipif(os.getuid() != 0, reason="other owners are made with chown (root only)")


class Audit:
    """Every path this process opened while the audit was on (builtins.open, io.open, os.open, also
    relative to a directory descriptor) and the bytes os.readv read. A path opened is checked by where
    it leads now (its realpath)."""

    def __init__(self, monkeypatch) -> None:
        self.opened: list[str] = []
        self.bytes_read = 0
        real_open, real_os_open, real_readv = builtins.open, os.open, os.readv

        def audited_open(file, *args, **kwargs):
            opened = real_open(file, *args, **kwargs)  # only what was opened: O_NOFOLLOW refusing a link is fine
            if isinstance(file, (str, bytes, os.PathLike)):
                self.opened.append(os.fsdecode(os.fspath(file)))
            return opened

        def audited_os_open(path, *args, **kwargs):
            fd = real_os_open(path, *args, **kwargs)
            name = os.fsdecode(os.fspath(path))
            if kwargs.get("dir_fd") is not None:  # openat: where the directory descriptor leads
                name = os.path.join(os.readlink(f"/proc/self/fd/{kwargs['dir_fd']}"), name)
            self.opened.append(name)
            return fd

        def audited_readv(fd, buffers):
            got = real_readv(fd, buffers)
            self.bytes_read += got
            if self.bytes_read > READ_BUDGET:  # a sparse "rest" being hashed: fail instead of hanging for hours
                raise AssertionError(f"read {self.bytes_read} bytes: far more than any tree here holds")
            return got

        monkeypatch.setattr(builtins, "open", audited_open)
        monkeypatch.setattr(io, "open", audited_open)
        monkeypatch.setattr(os, "open", audited_os_open)
        monkeypatch.setattr(os, "readv", audited_readv)

    def outside(self, tree: Path, allowed: list[Path]) -> list[str]:
        """Opened paths that lead (through any link) outside ``tree`` and are not ``allowed``."""
        inside = os.path.realpath(tree) + os.sep
        allowed_real = {os.path.realpath(p) for p in allowed}
        bad = []
        for text in self.opened:
            real = os.path.realpath(text)
            if not (real + os.sep).startswith(inside) and not any(real.startswith(a) for a in allowed_real):
                bad.append(text)
        return bad


READ_BUDGET = 256 << 20  # every real checkpoint here is a few MiB; a 1 TiB sparse file is not
ABSENT = st.lists(st.sampled_from(["step_000000099", f"step_{'9' * 40}", "gone-1_4.ckpt", "../../etc/passwd",
                                   "a/b/c", "checkpoint_network/rank_0/x-network-1_2.ckpt"]), max_size=5)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(entries=hostile_trees.entries_strategy(), absent=ABSENT, run_file=st.sampled_from((None, *KINDS)))
def test_intake_over_any_generated_tree_never_crashes_or_reads_outside_it(tmp_path_factory, monkeypatch,
                                                                           entries, absent, run_file):
    tmp = tmp_path_factory.mktemp("tree")
    outside = hostile_trees.bait(tmp)
    ckpt = tmp / "ckpt"
    made = hostile_trees.build(ckpt, entries, outside)
    if run_file is not None:
        hostile_trees.build(ckpt, [Entry(layout.RUN_FILE, run_file)], outside)
    ledger = Ledger(tmp / "ledger.sqlite")
    intake = Intake(ckpt, ledger, dataclasses.replace(EvaldConfig(), lag_policy="all"))
    with monkeypatch.context() as patched:
        audit = Audit(patched)
        for name in sorted(os.listdir(ckpt)) + absent:
            intake.found(name, "rescan")
            intake.found(name, "zmq")       # a notice of the same entry: judged once
        intake.recheck_settled()
        trainer_files.read_announcement(ckpt)
        declared = 0
        for row in ledger.steps():
            if row.kind == EVALD:
                declared += _read_found(ckpt, row.source)
    assert audit.outside(ckpt, [tmp / "ledger.sqlite"]) == [], "opened outside the checkpoint directory"
    assert audit.bytes_read <= declared + 1 << 20, (audit.bytes_read, declared)  # never a sparse "rest"
    files = [name for name, *_ in ledger.files()]
    keys = {_printable(raw) for raw in os.listdir(os.fsencode(ckpt))}  # the real entries (a loop is two)
    assert len(files) == len(set(files)) <= len(keys)  # at most one row per real entry
    assert set(files) <= keys, set(files) - keys       # no row for an entry that does not exist
    assert len(ledger.step_numbers()) <= len(keys) and made
    ledger.close()


def _printable(raw: bytes) -> str:
    """The ledger's name for an entry, derived here from the name's bytes as the kernel lists them (not from
    the intake's string handling, which this test checks):
    the name when it is valid UTF-8, else its bytes with each invalid one written as ``\\xNN``."""
    return raw.decode("utf-8", "backslashreplace")


def _read_found(ckpt: Path, name: str) -> int:
    """What loading a found evald checkpoint reads (weights.load_into without the network): the bytes
    its manifest's tensors and headers account for, at most."""
    try:
        with confined(ckpt, name, directory=True):
            manifest = layout.read_manifest(ckpt / name)
            bound = len(manifest.files) << 20  # a header is a few KiB: 1 MiB a file is generous
            data = sum(sio.Segment(p.name, p.dtype, p.shape, p.offset or 0).nbytes for p in manifest.params)
            layout.read_checkpoint(ckpt / name, manifest)
    except (layout.LayoutError, CheckpointError):
        return 1 << 20
    return data + bound + (1 << 20)
