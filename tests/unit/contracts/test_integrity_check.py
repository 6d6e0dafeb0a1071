"""The integrity check of a snapshot's files: xxh3-128 by default, sha256 on request, either read.

Real snapshots from the real writer (``layout.write_checkpoint``, the commit ``SnapshotWriter``
runs), damaged on disk, then read by evald's read path: ``layout.read_checkpoint`` (what
``NetworkWeights.load`` calls) and, for the snapshot as a whole, ``evald.pipeline.swap.weights.load_into``
into a real MindSpore network. Every test here was seen to fail with its check broken
(the digest not compared, the size not checked, an unknown check accepted).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import xxhash
from safetensors.numpy import save_file

from evald.contracts import integrity, layout
from evald.contracts import safetensors_io as sio

CHECKS = ("xxh3-128", "sha256")
BY_HAND = {"xxh3-128": lambda data: xxhash.xxh3_128(data).hexdigest(),   # what xxh128sum prints
           "sha256": lambda data: hashlib.sha256(data).hexdigest()}      # what sha256sum prints


def small_weights(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    # In files of about 200 bytes: [a], [c, d], [b]; a's and b's files have the same size and layout.
    return {"a": rng.standard_normal((8, 8)).astype(np.float32),
            "c": rng.standard_normal(5).astype(np.float64), "d": np.arange(7, dtype=np.int16),
            "b": rng.standard_normal((8, 8)).astype(np.float32)}


def commit(root: Path, step: int, check: str | None, seed: int = 0, shard_bytes: int = 200) -> Path:
    kwargs = {} if check is None else {"hash_algorithm": check}
    return layout.write_checkpoint(root, step, small_weights(seed), run_id="r", shard_bytes=shard_bytes, **kwargs)


def read(path: Path) -> dict[str, np.ndarray]:
    return layout.read_checkpoint(path, layout.read_manifest(path), threads=2)


@pytest.mark.parametrize("check", CHECKS)
def test_the_manifest_names_the_check_and_its_version_and_the_digests_are_the_by_hand_ones(tmp_path, check):
    path = commit(tmp_path, 1, check)
    data = json.loads((path / layout.MANIFEST_FILE).read_text())
    assert data["hash"] == {"algorithm": check, "version": 1}
    assert len(data["files"]) >= 3
    for spec in data["files"]:
        assert spec["digest"] == BY_HAND[check]((path / spec["name"]).read_bytes())
    got = read(path)
    assert all(np.array_equal(got[n], a) for n, a in small_weights().items())


def test_the_default_check_is_xxh3_128(tmp_path):
    assert layout.read_manifest(commit(tmp_path, 1, None)).hash_algorithm == "xxh3-128" == integrity.DEFAULT


@pytest.mark.parametrize("check", CHECKS)
def test_any_single_byte_changed_in_any_file_is_detected(tmp_path, check):
    path = commit(tmp_path, 1, check)
    manifest = layout.read_manifest(path)
    tried = 0
    for spec in manifest.files:
        target = path / spec.name
        original = target.read_bytes()
        for at in range(len(original)):  # every byte: the length prefix, the header, the padding, the data
            damaged = bytearray(original)
            damaged[at] ^= 0x01 << (at % 8)   # one bit, a different one at each position
            target.write_bytes(bytes(damaged))
            with pytest.raises(layout.LayoutError) as caught:
                layout.read_checkpoint(path, manifest, threads=2)
            assert f"{spec.name}: {check} " in str(caught.value) and "does not match" in str(caught.value), (at, caught.value)
            tried += 1
        target.write_bytes(original)
    assert tried == sum(f.bytes for f in manifest.files)
    read(path)  # restored: it reads again


@pytest.mark.parametrize("check", CHECKS)
def test_a_truncated_file_is_detected_and_so_is_one_torn_back_to_its_size(tmp_path, check):
    path = commit(tmp_path, 1, check)
    target = path / layout.read_manifest(path).files[0].name
    size = target.stat().st_size
    os.truncate(target, size - 100)
    with pytest.raises(layout.LayoutError, match=f"{target.name}: {size - 100} bytes on disk but the manifest "
                                                 f"says {size} .truncated"):
        read(path)
    os.truncate(target, size)  # a torn write: the right size, its tail zeros; only the digest can tell
    with pytest.raises(layout.LayoutError, match=f"{target.name}: {check} .* does not match"):
        read(path)


@pytest.mark.parametrize("check", CHECKS)
def test_a_file_swapped_for_another_snapshots_or_for_its_neighbour_is_detected(tmp_path, check):
    one, two = commit(tmp_path, 1, check, seed=1), commit(tmp_path, 2, check, seed=2)
    name = next(p.file for p in layout.read_manifest(two).params if p.name == "a")
    original = (two / name).read_bytes()
    shutil.copyfile(one / name, two / name)  # same size, same header: another step's values
    assert (two / name).read_bytes()[:64] == original[:64]
    with pytest.raises(layout.LayoutError, match=f"{name}: {check} .* does not match"):
        read(two)
    (two / name).write_bytes(original)
    other = next(p.file for p in layout.read_manifest(two).params if p.name == "b")
    assert (two / name).stat().st_size == (two / other).stat().st_size   # a's and b's files: same size
    os.rename(two / name, two / "x")
    os.rename(two / other, two / name)
    os.rename(two / "x", two / other)
    with pytest.raises(layout.LayoutError, match=f"{check} .* does not match"):
        read(two)


def todays_sha256_snapshot(root: Path, step: int, weights: dict[str, np.ndarray]) -> Path:
    """A snapshot as evald before this change wrote it: layout version 2, ``"hash": {"algorithm":
    "sha256", "version": 1}``; built here by hand, its files by the safetensors package."""
    path = root / layout.step_dir_name(step)
    path.mkdir(parents=True)
    files, params = [], []
    for i, names in enumerate((["a", "c"], ["b", "d"]), 1):
        name = f"weights-{i:05d}-of-00002.safetensors"
        save_file({n: weights[n] for n in names}, str(path / name))
        data = (path / name).read_bytes()
        header_len = int.from_bytes(data[:8], "little")
        header = json.loads(data[8:8 + header_len])
        files.append({"name": name, "bytes": len(data), "digest": hashlib.sha256(data).hexdigest()})
        params += [{"name": n, "shape": list(weights[n].shape), "dtype": weights[n].dtype.name, "file": name,
                    "offset": 8 + header_len + header[n]["data_offsets"][0]} for n in names]
    manifest = {"layout_version": 2, "run_id": "old", "step": step, "epoch": None, "commit_time": 1764500000.0,
                "hash": {"algorithm": "sha256", "version": 1}, "files": files, "params": params,
                "resume": {"learning_rate": None, "loss_scale": None, "seed": None, "data_offset": None},
                "producer": {"rank": 0, "world_size": 1, "host": "h", "pid": 1}}
    (path / layout.MANIFEST_FILE).write_text(json.dumps(manifest, indent=1, sort_keys=True))
    return path


def test_a_sha256_snapshot_of_todays_layout_still_loads_and_is_still_verified(tmp_path):
    w = small_weights(5)
    path = todays_sha256_snapshot(tmp_path, 7, w)
    manifest = layout.read_manifest(path)
    assert (manifest.hash_algorithm, manifest.hash_version, manifest.layout_version) == ("sha256", 1, 2)
    got = read(path)
    assert all(np.array_equal(got[n], a) for n, a in w.items())
    target = path / manifest.files[1].name
    data = bytearray(target.read_bytes())
    data[-1] ^= 0x80
    target.write_bytes(bytes(data))
    with pytest.raises(layout.LayoutError, match=f"{target.name}: sha256 .* does not match"):
        read(path)


def edit_hash(path: Path, value) -> None:
    data = json.loads((path / layout.MANIFEST_FILE).read_text())
    data["hash"] = value
    (path / layout.MANIFEST_FILE).write_text(json.dumps(data))


@pytest.mark.parametrize("value, words", [
    ({"algorithm": "md4", "version": 1}, "hash.algorithm='md4', hash.version=1 .*verifies xxh3-128 version 1, "
                                         "sha256 version 1"),
    ({"algorithm": "XXH3-128", "version": 1}, "hash.algorithm='XXH3-128'"),
    ({"algorithm": "xxh3-128", "version": 2}, "hash.algorithm='xxh3-128', hash.version=2 .*verifies xxh3-128 "
                                              "only in version 1"),
    ({"algorithm": "sha256", "version": 0}, "hash.version=0 .*verifies sha256 only in version 1"),
])
def test_an_unknown_check_or_version_is_refused_before_any_weights_file_is_read(tmp_path, value, words):
    path = commit(tmp_path, 1, None)
    edit_hash(path, value)
    for f in path.iterdir():
        if f.name != layout.MANIFEST_FILE:
            f.unlink()  # nothing to read: a refusal that opened a weights file would say "missing" instead
    with pytest.raises(layout.LayoutError) as caught:
        layout.read_manifest(path)
    message = str(caught.value)
    assert message.startswith(f"{path / layout.MANIFEST_FILE}: integrity check "), message
    assert "upgrade evald" in message and "EvaldHook(hash_algorithm=...)" in message
    assert re.search(words, message), message


@pytest.mark.parametrize("value, words", [
    ({"algorithm": "sha256", "version": True}, "hash.version"),     # bounded like every manifest integer
    ({"algorithm": "sha256", "version": 1.0}, "hash.version"),
    ({"algorithm": "", "version": 1}, "hash.algorithm"),
    ({"algorithm": "sha256"}, "hash.version: missing"),
    ("sha256", "hash: must be an object"),
])
def test_a_malformed_check_is_refused_naming_the_field(tmp_path, value, words):
    path = commit(tmp_path, 1, None)
    edit_hash(path, value)
    with pytest.raises(layout.LayoutError, match=words):
        layout.read_manifest(path)


def test_without_the_xxhash_package_an_xxh3_snapshot_is_refused_clearly(tmp_path, monkeypatch):
    path = commit(tmp_path, 1, "xxh3-128")
    monkeypatch.setattr(integrity, "xxhash", None)
    with pytest.raises(layout.LayoutError, match=r"MANIFEST.json: .*needs the xxhash package.*pip install xxhash"):
        layout.read_manifest(path)
    with pytest.raises(integrity.UnknownCheck, match="pip install xxhash"):
        commit(tmp_path, 2, "xxh3-128")
    layout.read_manifest(commit(tmp_path, 3, "sha256"))  # sha256 needs nothing but hashlib


def test_a_writer_refuses_an_unknown_check_before_writing_anything(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="'crc32' is not one the checkpoint layout knows; choose xxh3-128 or sha256"):
        commit(tmp_path, 1, "crc32")
    assert list(tmp_path.iterdir()) == []
    from trainer_hooks.snapshot_writer import SnapshotJob, SnapshotWriter

    with pytest.raises(ValueError, match="'md5'"):
        SnapshotWriter(tmp_path, "r", on_committed=lambda *a: None, hash_algorithm="md5")
    writer = SnapshotWriter(tmp_path, "r", on_committed=lambda *a: None, hash_algorithm="sha256",
                            orphan_temp_age_s=None)
    try:
        assert writer.try_submit(SnapshotJob(step=4, weights=small_weights()))
        assert writer.wait_idle(30)
    finally:
        writer.close()
    assert layout.read_manifest(tmp_path / layout.step_dir_name(4)).hash_algorithm == "sha256"


def test_the_hook_takes_the_check_from_its_argument_or_evald_hash(tmp_path, monkeypatch):
    from trainer_hooks.hook import EvaldHook

    monkeypatch.setenv("EVALD_SOCKET_DIR", str(tmp_path / "sockets"))
    with pytest.raises(ValueError, match="'blake3'"):
        EvaldHook(tmp_path / "c0", obey_stop=False, hash_algorithm="blake3")
    monkeypatch.setenv("EVALD_HASH", "sha256")
    hook = EvaldHook(tmp_path / "c1", obey_stop=False)
    try:
        assert hook.hash_algorithm == "sha256" and hook.writer.hash_algorithm == "sha256"
    finally:
        hook.train_end(0)
    monkeypatch.delenv("EVALD_HASH")
    hook = EvaldHook(tmp_path / "c2", obey_stop=False)
    try:
        assert hook.writer.hash_algorithm == "xxh3-128"
    finally:
        hook.train_end(0)


def test_the_snapshot_digest_of_provenance_is_derived_from_the_per_file_checks(tmp_path):
    from evald.pipeline.swap.swap_check import weights_digest

    same_a, same_b = commit(tmp_path / "a", 1, None), commit(tmp_path / "b", 1, None)
    other = commit(tmp_path / "c", 1, None, seed=9)
    sha = commit(tmp_path / "d", 1, "sha256")
    digest = {p: weights_digest(layout.read_manifest(p), None) for p in (same_a, same_b, other, sha)}
    assert digest[same_a] == digest[same_b]                       # the same bytes: the same digest
    assert digest[other][0] != digest[same_a][0]                  # other bytes: another digest
    assert digest[sha][0] != digest[same_a][0]                    # the check is part of what is digested
    assert digest[same_a][1] == "sha256 of the manifest's verified xxh3-128 file digests"
    assert digest[sha][1] == "sha256 of the manifest's verified sha256 file digests"
    listing = "\n".join(f"{f.name} xxh3-128:{f.digest}" for f in layout.read_manifest(same_a).files)
    assert digest[same_a][0] == hashlib.sha256(listing.encode()).hexdigest()


@pytest.fixture(scope="module")
def network():
    mindspore = pytest.importorskip("mindspore")
    from examples.tiny_lm import model

    net = model.build_model(seq_len=16, d_model=32, seed=0)
    net.set_train(False)
    return mindspore, net


@pytest.mark.parametrize("check", CHECKS)
def test_evalds_load_reads_either_check_into_the_network_and_fails_a_corrupt_one(tmp_path, network, check):
    from evald.files.recognise import EVALD, CheckpointError
    from evald.pipeline.swap.hot_swap import NetworkWeights
    from evald.pipeline.swap.weights import load_into

    _, net = network
    rng = np.random.default_rng(3)
    weights = {n: (p.asnumpy() + rng.standard_normal(p.shape)).astype(p.asnumpy().dtype)
               for n, p in net.parameters_and_names()}
    path = layout.write_checkpoint(tmp_path, 5, weights, run_id="r", shard_bytes=16 << 10, hash_algorithm=check)
    swap = NetworkWeights(net)
    manifest = load_into(swap, path, EVALD)
    assert manifest.hash_algorithm == check and len(manifest.files) > 1 and swap.valid
    assert all(np.array_equal(p.asnumpy(), weights[n]) for n, p in net.parameters_and_names())
    target = path / manifest.files[-1].name
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x04
    target.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=f"{target.name}: {check} .* does not match"):
        load_into(swap, path, EVALD)
    assert not swap.valid
    edit_hash(path, {"algorithm": "xxh3-64", "version": 1})
    with pytest.raises(CheckpointError, match="hash.algorithm='xxh3-64'.*upgrade evald"):
        load_into(swap, path, EVALD)


def test_the_hashers_of_the_read_and_write_paths_are_the_registrys():
    assert set(sio.HASHES) == set(CHECKS) == set(integrity.ALGORITHMS)
    for name in CHECKS:
        h = sio.HASHES[name]()
        h.update(b"evald")
        assert h.hexdigest() == BY_HAND[name](b"evald")
