"""Layout version 2 at scale: several files hashed as written, read once into place, checked at
every boundary; version-1 checkpoints refused. Real files throughout (small ones)."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.numpy import load_file, save_file

from evald.contracts import layout

SHARD = 4096


def many_weights(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"emb": rng.standard_normal((64, 16)).astype(np.float32),          # 4 KiB: its own file
            "h.0.w": rng.standard_normal((16, 16)).astype(np.float16),
            "h.0.b": rng.standard_normal(16).astype(np.float64),
            "h.1.w": rng.standard_normal((16, 16)).astype(np.float32),
            "steps": np.array(7, np.int64), "mask": rng.random(13) > 0.5, "empty": np.zeros((0, 4), np.float32),
            "head": rng.standard_normal((16, 40)).astype(np.float32)}


@pytest.fixture
def sharded(tmp_path):
    w = many_weights()
    path = layout.write_checkpoint(tmp_path, 3, w, run_id="r", shard_bytes=SHARD)
    return w, path, layout.read_manifest(path)


class FileOpens:
    """Every open() of a file under ``root`` while active, as (name, opened for reading?), via audit hooks.
    An ``os.open(name, dir_fd=fd)`` (evald.contracts.safe_open opens below a directory so) is seen with the
    directory ``fd`` leads to, which the audit event itself does not carry."""

    hooked: list = []
    installed = False  # an audit hook cannot be removed: install one, for the whole session
    base = threading.local()

    def __init__(self, root: Path) -> None:
        self.root, self.seen = str(root), []
        if not FileOpens.installed:
            sys.addaudithook(lambda event, args: FileOpens._event(event, args))
            FileOpens.installed = True
        FileOpens.hooked.append(self)

    @staticmethod
    def _event(event, args):
        if event == "open" and FileOpens.hooked and isinstance(args[0], (str, os.PathLike)):
            path = os.path.join(getattr(FileOpens.base, "dir", None) or os.getcwd(), os.fspath(args[0]))
            for watcher in FileOpens.hooked:
                if path.startswith(watcher.root):
                    flags = args[2] if isinstance(args[2], int) else 0
                    mode = args[1] or ""
                    reading = "r" in mode or "+" in mode if mode else (flags & os.O_ACCMODE) != os.O_WRONLY
                    if not flags & os.O_DIRECTORY:
                        watcher.seen.append((Path(path).name, reading))

    def __enter__(self):
        self.real_open = os.open

        def os_open(path, flags, mode=0o777, *, dir_fd=None):
            FileOpens.base.dir = os.readlink(f"/proc/self/fd/{dir_fd}") if dir_fd is not None else None
            try:
                return self.real_open(path, flags, mode, dir_fd=dir_fd)
            finally:
                FileOpens.base.dir = None
        os.open = os_open
        return self

    def __exit__(self, *exc):
        os.open = self.real_open
        FileOpens.hooked.remove(self)


def test_large_snapshot_is_split_and_every_file_is_plain_safetensors(sharded):
    w, path, manifest = sharded
    assert len(manifest.files) >= 3
    assert sorted(os.listdir(path)) == sorted([layout.MANIFEST_FILE] + [f.name for f in manifest.files])
    found = {}
    for spec in manifest.files:
        data = (path / spec.name).read_bytes()
        assert spec.bytes == len(data) and spec.digest == xxhash.xxh3_128(data).hexdigest()  # as xxh128sum prints
        found.update(load_file(str(path / spec.name)))   # the safetensors package reads our files
    assert found.keys() == w.keys() and all(np.array_equal(found[k], w[k]) for k in w)
    by_name = {p.name: p for p in manifest.params}
    assert [p.name for p in manifest.params] == list(w)  # the trainer's order
    for name, array in w.items():  # each parameter's bytes are where the manifest says
        raw = (path / by_name[name].file).read_bytes()[by_name[name].offset:][:array.nbytes]
        assert raw == array.tobytes()


def test_commit_never_reads_a_weights_file_back(tmp_path):
    with FileOpens(tmp_path) as opens:
        layout.write_checkpoint(tmp_path, 1, many_weights(), run_id="r", shard_bytes=SHARD)
    weights_opens = [(n, r) for n, r in opens.seen if n.endswith(".safetensors")]
    assert len(weights_opens) >= 3 and not any(reading for _, reading in weights_opens)


def test_read_opens_each_file_once_and_fills_the_given_arrays(sharded):
    w, path, manifest = sharded
    into = {"emb": np.zeros((64, 16), np.float32), "head": np.zeros((16, 40), np.float32)}
    with FileOpens(path) as opens:
        out = layout.read_checkpoint(path, manifest, into=into, threads=2)
    names = [n for n, _ in opens.seen if n.endswith(".safetensors")]
    assert sorted(names) == sorted(f.name for f in manifest.files)   # once each
    assert out["emb"] is into["emb"] and out["head"] is into["head"]
    assert all(np.array_equal(out[k], w[k]) and out[k].dtype == w[k].dtype and out[k].shape == w[k].shape
               for k in w)


@pytest.mark.parametrize("bad, words", [
    (np.zeros((16, 41), np.float32), "destination for 'head' is float32[16, 41], the file holds float32[16, 40]"),
    (np.zeros((16, 40), np.float64), "destination for 'head' is float64"),
    (np.zeros((40, 16), np.float32).T, "not a writable C-contiguous array"),
])
def test_a_destination_that_does_not_fit_is_refused(sharded, bad, words):
    _, path, manifest = sharded
    with pytest.raises(layout.LayoutError, match=words.replace("[", r"\[").replace("]", r"\]")):
        layout.read_checkpoint(path, manifest, into={"head": bad})


def _file_of(manifest, name):
    return next(p.file for p in manifest.params if p.name == name)


def test_each_kind_of_damage_names_the_file_and_what(sharded, tmp_path):
    _, path, manifest = sharded
    target = path / _file_of(manifest, "head")
    original = target.read_bytes()

    def damaged(words, expect=layout.LayoutError):
        with pytest.raises(expect, match=words):
            layout.read_checkpoint(path, manifest, threads=2)
        target.unlink(missing_ok=True)
        target.write_bytes(original)

    flipped = bytearray(original)
    flipped[-1] ^= 0x10
    target.write_bytes(bytes(flipped))
    damaged(f"{target.name}: xxh3-128 .* does not match")
    target.write_bytes(np.random.default_rng(5).bytes(len(original)))   # garbage header too: still the hash
    damaged(f"{target.name}: xxh3-128 .* does not match .*; header length")
    target.write_bytes(original[:-5])
    damaged(f"{target.name}: {len(original) - 5} bytes on disk but the manifest says {len(original)}")
    target.write_bytes(original + b"more")              # never read past what the manifest declares
    damaged("bytes on disk but the manifest says")
    target.unlink()
    damaged(f"{target.name}: weights file missing")
    target.unlink()
    os.mkfifo(target)                                     # would block a naive open(); refused instead
    damaged("not a regular file")


def test_a_file_that_shrinks_after_its_size_was_checked_is_an_error_not_a_hang(sharded, monkeypatch):
    """The race (truncated between fstat and read) made deterministic: fstat reports the
    manifest's size (a stand-in for the moment of the check), the file is already shorter."""
    _, path, manifest = sharded
    spec = next(f for f in manifest.files if f.name == _file_of(manifest, "emb"))
    os.truncate(path / spec.name, spec.bytes // 2)
    real_fstat = os.fstat

    def fstat_before_truncation(fd):
        result = real_fstat(fd)
        if result.st_size == spec.bytes // 2:
            return os.stat_result((result.st_mode,) + tuple(result)[1:6] + (spec.bytes,) + tuple(result)[7:])
        return result
    monkeypatch.setattr(os, "fstat", fstat_before_truncation)
    with pytest.raises(layout.LayoutError, match=f"{spec.name}: file ended early"):
        layout.read_checkpoint(path, manifest)


def edit_manifest(path: Path, change) -> None:
    data = json.loads((path / layout.MANIFEST_FILE).read_text())
    change(data)
    (path / layout.MANIFEST_FILE).write_text(json.dumps(data))


@pytest.mark.parametrize("change, words", [
    (lambda d: d["files"][0].update(name="../../etc/passwd"), "not a plain weights file name"),
    (lambda d: d["files"][0].update(name=layout.MANIFEST_FILE), "not a plain weights file name"),
    (lambda d: d["params"][0].update(offset=10**12), "lies outside"),
    (lambda d: d["params"][1].update(offset=d["params"][2]["offset"], file=d["params"][2]["file"]), "overlap"),
    (lambda d: d["params"][0].update(file="nowhere.safetensors"), "does not list"),
    (lambda d: d["params"].append(dict(d["params"][0])), "listed twice"),
    (lambda d: d["params"][0].update(dtype="complex64"), "complex64"),
    (lambda d: d["files"][0].update(digest="abc"), "digest"),
    (lambda d: d.update(hash={"algorithm": "md4", "version": 1}), "upgrade evald"),
    (lambda d: d.update(hash={"algorithm": "sha256", "version": 2}), "upgrade evald"),
    (lambda d: d.update(parts={"count": 4}), "partitioned"),
    (lambda d: d["params"][0].update(slice=[[0, 32], [0, 16]]), "partitioned"),
])
def test_a_manifest_that_lies_or_escapes_is_refused_before_any_read(sharded, change, words):
    _, path, _ = sharded
    edit_manifest(path, change)
    with pytest.raises(layout.LayoutError, match=words):
        layout.read_manifest(path)


def test_a_header_that_disagrees_with_the_manifest_is_refused(sharded):
    _, path, _ = sharded
    def swap_dtype(d):  # consistent sizes, different meaning
        same_file = [p for p in d["params"] if p["name"] in ("h.0.w", "h.1.w")]
        if same_file[0]["file"] != same_file[1]["file"]:
            pytest.skip("the two parameters landed in different files")
        same_file[0]["name"], same_file[1]["name"] = same_file[1]["name"], same_file[0]["name"]
    edit_manifest(path, swap_dtype)
    with pytest.raises(layout.LayoutError, match="header does not list"):
        layout.read_checkpoint(path, layout.read_manifest(path))


def write_version_1(ckpt_dir: Path, step: int, w: dict) -> Path:
    """A checkpoint as the unreleased layout version 1 committed it."""
    path = ckpt_dir / layout.step_dir_name(step)
    path.mkdir(parents=True)
    save_file(w, str(path / "weights.safetensors"))
    data = (path / "weights.safetensors").read_bytes()
    (path / layout.MANIFEST_FILE).write_text(json.dumps({
        "layout_version": 1, "run_id": "old", "step": step, "epoch": None, "commit_time": 1.0,
        "weights_file": "weights.safetensors", "weights_bytes": len(data),
        "weights_sha256": hashlib.sha256(data).hexdigest(),
        "params": [{"name": k, "shape": list(v.shape), "dtype": str(v.dtype)} for k, v in w.items()],
        "resume": {"learning_rate": 0.1}, "producer": {}}))
    return path


def test_a_version_1_checkpoint_is_refused_with_a_clear_error(tmp_path):
    """No reader for layout version 1: nothing released ever wrote it (issue 16)."""
    path = write_version_1(tmp_path, 9, {"a": np.zeros(3, np.float32)})
    with pytest.raises(layout.LayoutError, match=r"layout_version 1 is not one this code reads \(2, 3\)"):
        layout.read_manifest(path)


DTYPES = ["float32", "float16", "float64", "int8", "int16", "int32", "int64", "uint8", "bool"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(specs=st.lists(st.tuples(st.sampled_from(DTYPES), st.lists(st.integers(0, 9), max_size=3)),
                      min_size=0, max_size=12),
       shard=st.integers(1, 2000), threads=st.integers(1, 3), seed=st.integers(0, 2**31))
def test_any_weights_round_trip_bit_exactly(tmp_path_factory, specs, shard, threads, seed):
    rng = np.random.default_rng(seed)
    w = {f"p{i}.{dtype}": rng.integers(0, 256, int(np.prod(shape)) * np.dtype(dtype).itemsize, dtype=np.uint8)
         .view(dtype if dtype != "bool" else "uint8").reshape(shape).astype(dtype)
         for i, (dtype, shape) in enumerate(specs)}
    root = tmp_path_factory.mktemp("rt")
    path = layout.write_checkpoint(root, 1, w, run_id="r", shard_bytes=shard, threads=threads)
    manifest = layout.read_manifest(path)
    out = layout.read_checkpoint(path, manifest, threads=threads)
    assert list(out) == list(w)
    for k in w:
        assert out[k].dtype == w[k].dtype and out[k].shape == w[k].shape
        assert out[k].tobytes() == w[k].tobytes()  # bit-exact, NaN payloads included
