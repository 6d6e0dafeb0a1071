"""Issue 19, kind 8: a hard link in the served tree is refused, like a symbolic link.

A hard link to a file outside the checkpoint directory was read as a foreign checkpoint: the
confinement covered symbolic links only. Neither MindSpore's writers (``save_checkpoint`` writes
``x.tmp`` and renames it) nor evald's (``O_EXCL`` files in a temporary directory renamed into place)
ever hard-link, so a regular file with more than one link is not one a producer committed: the
entry is rejected with the reason (docs/security.md)."""

from __future__ import annotations

import os
import shutil

import pytest

from evald.contracts import layout, small_files
from evald.files.recognise import Rejected, recognise
from tests import faults


def test_a_foreign_file_hard_linked_from_outside_is_rejected(tmp_path):
    ckpt, outside = tmp_path / "ckpt", tmp_path / "outside"
    ckpt.mkdir()
    outside.mkdir()
    (outside / "secret.ckpt").write_bytes(b"s" * 651)
    os.link(outside / "secret.ckpt", ckpt / "net-1_5.ckpt")  # the step is in the name: never even opened
    verdict = recognise(ckpt, "net-1_5.ckpt")
    assert isinstance(verdict, Rejected) and "hard link" in verdict.reason, verdict


def test_weights_hard_linked_from_outside_are_refused_before_a_read(tmp_path):
    ckpt = tmp_path / "ckpt"
    step_dir = faults.commit(ckpt, 1)
    weights = step_dir / layout.WEIGHTS_FILE
    copy = tmp_path / "outside.safetensors"
    shutil.copy(weights, copy)
    os.chmod(step_dir, 0o755)
    weights.unlink()
    os.link(copy, weights)   # the same bytes, so only the link count can tell
    with pytest.raises(layout.LayoutError, match="hard link"):
        layout.read_checkpoint(step_dir, layout.read_manifest(step_dir))


def test_a_manifest_or_run_file_hard_linked_from_outside_is_refused(tmp_path):
    step_dir = faults.commit(tmp_path / "ckpt", 1)
    manifest = step_dir / layout.MANIFEST_FILE
    os.chmod(step_dir, 0o755)
    os.link(manifest, tmp_path / "outside.json")
    with pytest.raises(layout.LayoutError, match="hard link"):
        layout.read_manifest(step_dir)
    with pytest.raises(small_files.UnsafeFile, match="hard link"):
        small_files.read_regular(manifest, small_files.MAX_RUN_FILE_BYTES)
