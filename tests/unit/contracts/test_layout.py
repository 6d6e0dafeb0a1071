"""The checkpoint layout contract: commit protocol, manifest, verification, cleanup."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import xxhash

from evald.contracts import layout


def weights():
    rng = np.random.default_rng(0)
    return {"a.weight": rng.standard_normal((4, 3)).astype(np.float32), "b": np.arange(5, dtype=np.int32)}


def test_commit_writes_manifest_last_and_round_trips(tmp_path):
    path = layout.write_checkpoint(tmp_path, 100, weights(), run_id="r1", epoch=2,
                                   resume=layout.ResumeInfo(learning_rate=1e-3, loss_scale=1024.0, seed=7,
                                                            data_offset=1600))
    assert path.name == "step_000000100"
    manifest = layout.read_manifest(path)
    assert (manifest.run_id, manifest.step, manifest.epoch) == ("r1", 100, 2)
    assert manifest.layout_version == 2 and manifest.hash_algorithm == "xxh3-128"
    assert manifest.resume == layout.ResumeInfo(1e-3, 1024.0, 7, 1600)
    assert {p.name: (p.shape, p.dtype) for p in manifest.params} == {
        "a.weight": ((4, 3), "float32"), "b": ((5,), "int32")}
    [spec] = manifest.files
    data = (path / layout.WEIGHTS_FILE).read_bytes()
    assert (spec.name, spec.bytes, spec.digest) == (layout.WEIGHTS_FILE, len(data), xxhash.xxh3_128(data).hexdigest())
    assert layout.Manifest.from_json(manifest.to_json()) == manifest
    assert layout.list_committed(tmp_path) == [(100, path)]


def test_nothing_is_visible_before_the_rename(tmp_path):
    seen = {}

    def before_commit(tmp_dir):
        seen["tmp_has_manifest"] = (tmp_dir / layout.MANIFEST_FILE).exists()
        seen["committed"] = layout.list_committed(tmp_path)

    layout.write_checkpoint(tmp_path, 5, weights(), run_id="r", before_commit=before_commit)
    assert seen == {"tmp_has_manifest": True, "committed": []}


def test_failed_write_leaves_no_checkpoint_and_no_temp(tmp_path):
    def explode(_tmp_dir):
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        layout.write_checkpoint(tmp_path, 5, weights(), run_id="r", before_commit=explode)
    assert os.listdir(tmp_path) == []


def test_a_failing_file_among_several_fails_the_commit_and_leaves_nothing(tmp_path):
    many = {f"p{i}": np.full(1000, i, np.float32) for i in range(6)}
    many["p4"] = np.zeros(1000, np.complex64)  # a dtype the layout cannot store, in the 3rd file
    with pytest.raises(ValueError, match="p4"):
        layout.write_checkpoint(tmp_path, 5, many, run_id="r", shard_bytes=8000, threads=3)
    assert os.listdir(tmp_path) == []


def test_existing_step_is_not_overwritten(tmp_path):
    layout.write_checkpoint(tmp_path, 5, weights(), run_id="r")
    with pytest.raises(layout.AlreadyCommitted):
        layout.write_checkpoint(tmp_path, 5, weights(), run_id="r")


def test_verification_catches_truncation_and_bit_flips(tmp_path):
    path = layout.write_checkpoint(tmp_path, 1, weights(), run_id="r")
    manifest = layout.read_manifest(path)
    data = bytearray((path / layout.WEIGHTS_FILE).read_bytes())
    data[-3] ^= 0x01
    (path / layout.WEIGHTS_FILE).write_bytes(bytes(data))
    with pytest.raises(layout.LayoutError, match="xxh3-128 .* does not match .*bit flip"):
        layout.read_checkpoint(path, manifest)
    (path / layout.WEIGHTS_FILE).write_bytes(bytes(data[:10]))
    with pytest.raises(layout.LayoutError, match="truncated"):
        layout.read_checkpoint(path, manifest)


def test_bad_manifests_are_clear_errors(tmp_path):
    (tmp_path / "step_000000001").mkdir()
    with pytest.raises(layout.LayoutError, match="no MANIFEST.json"):
        layout.read_manifest(tmp_path / "step_000000001")
    (tmp_path / "step_000000001" / layout.MANIFEST_FILE).write_text("{not json")
    with pytest.raises(layout.LayoutError, match="not a valid manifest"):
        layout.read_manifest(tmp_path / "step_000000001")
    (tmp_path / "step_000000001" / layout.MANIFEST_FILE).write_text(json.dumps({"layout_version": 99}))
    with pytest.raises(layout.LayoutError, match="layout_version"):
        layout.read_manifest(tmp_path / "step_000000001")


def test_orphaned_temps_are_removed_but_young_ones_kept(tmp_path):
    old = tmp_path / ".step_000000003.tmp-abc123"
    old.mkdir()
    os.utime(old, (1, 1))
    young = tmp_path / ".step_000000004.tmp-def456"
    young.mkdir()
    still_written = tmp_path / ".step_000000005.tmp-0123ab"   # old directory, a file written just now
    still_written.mkdir()
    (still_written / "weights-00002-of-00002.safetensors").write_bytes(b"x")
    os.utime(still_written, (1, 1))
    removed = layout.remove_orphaned_temps(tmp_path, older_than_s=60)
    assert removed == [old] and young.exists() and still_written.exists()


def test_names():
    assert layout.step_dir_name(7) == "step_000000007"
    assert layout.parse_step_dir_name("step_000000007") == 7
    assert layout.parse_step_dir_name("step_7") is None
    assert layout.is_temp_name(".step_000000007.tmp-ab") and layout.is_temp_name("net-1_5.tmp")
    assert not layout.is_temp_name("net-1_5.ckpt")
