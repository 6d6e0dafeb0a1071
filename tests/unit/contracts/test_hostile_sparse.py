"""Issue 19, kind 1: a weights file whose manifest declares far more bytes than its tensors (a sparse
1 TiB file that uses no disk) is refused at once, before or without hashing "the rest"; and every
long read stops between chunks when evald is told to stop (SIGTERM), so a signal is answered quickly."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

from evald.contracts import layout
from evald.contracts import safetensors_io as sio
from tests import faults

SPARSE_BYTES = 256 << 20   # big enough that hashing "the rest" is 64 chunks; sparse, so it uses no disk


@pytest.fixture
def bytes_read(monkeypatch):
    """The bytes every os.readv of the test returned (safetensors_io reads with readv only)."""
    counted = [0]
    real = os.readv

    def readv(fd, buffers):
        got = real(fd, buffers)
        counted[0] += got
        return got

    monkeypatch.setattr(sio.os, "readv", readv)
    return counted


def _sparse_step(tmp_path, size: int = SPARSE_BYTES):
    """A committed step whose only weights file was extended (sparse) to ``size`` and whose manifest
    says so: what a writer of the checkpoint directory can do with two syscalls."""
    step_dir = faults.commit(tmp_path, 1)
    manifest = layout.read_manifest(step_dir)
    [spec] = manifest.files
    os.chmod(step_dir / spec.name, 0o644)
    os.truncate(step_dir / spec.name, size)
    lying = dataclasses.replace(manifest, files=(dataclasses.replace(spec, bytes=size),))
    os.chmod(step_dir, 0o755)
    (step_dir / layout.MANIFEST_FILE).chmod(0o644)
    (step_dir / layout.MANIFEST_FILE).write_text(lying.to_json())
    return step_dir, layout.read_manifest(step_dir), spec


def test_bytes_past_the_headers_tensors_are_refused_without_hashing_them(tmp_path, bytes_read):
    step_dir, manifest, spec = _sparse_step(tmp_path)
    with pytest.raises(sio.WeightsFileError, match="cover"):
        sio.read_file(step_dir / spec.name, nbytes=SPARSE_BYTES, digest=spec.digest, algorithm="sha256",
                      expected=None)
    assert bytes_read[0] < sio.CHUNK_BYTES, f"read {bytes_read[0]} bytes of a file its header does not cover"


def test_a_manifest_declaring_more_than_its_tensors_and_a_header_is_refused_before_a_byte_is_read(
        tmp_path, bytes_read):
    step_dir, manifest, spec = _sparse_step(tmp_path)
    with pytest.raises(layout.LayoutError, match="account for"):
        layout.read_checkpoint(step_dir, manifest)
    assert bytes_read[0] == 0


def test_a_long_read_stops_between_chunks_when_evald_is_told_to_stop(tmp_path, bytes_read):
    weights = {"w": np.arange(6 * sio.CHUNK_BYTES // 4, dtype=np.float32)}  # six chunks
    step_dir = faults.commit(tmp_path, 2, weights)
    manifest = layout.read_manifest(step_dir)
    asked = []

    def told_to_stop() -> bool:
        asked.append(1)
        return len(asked) > 2

    sio.stop_reading_when(told_to_stop)
    try:
        with pytest.raises(sio.ReadInterrupted):
            layout.read_checkpoint(step_dir, manifest)
    finally:
        sio.stop_reading_when(None)
    assert bytes_read[0] <= 3 * sio.CHUNK_BYTES
    assert not isinstance(sio.ReadInterrupted("x"), sio.WeightsFileError)  # never a verdict on the checkpoint
    assert set(layout.read_checkpoint(step_dir, manifest)) == {"w"}  # the hook removed: reads again
