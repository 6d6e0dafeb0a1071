"""The per-sample files' writer and their one reader: the round trip, the current identity, and
validation with the file and line named, within bounds (the files are input)."""

from __future__ import annotations

import gzip
import json
import os

import pytest

from evald.ledger import samples as samples_module
from evald.ledger.samples import (SampleFileError, SamplesNotFound, current, find_samples, list_samples,
                                  read_documents, read_samples, read_sidecar, read_step, samples_paths,
                                  write_samples)
from tests.sample_outputs import IDENTITY, identity_hash, write_task_samples

NEWER = {**IDENTITY, "tokenizer": "cd" * 16}


def test_the_newest_sidecar_of_a_step_is_current_and_the_documents_come_back_sorted(tmp_path):
    write_task_samples(tmp_path, "fast", "hellaswag", 100, IDENTITY, {"acc": [1, 0, 1]}, doc_ids=[5, 2, 9],
                       mtime_ns=1_000_000_000)
    write_task_samples(tmp_path, "fast", "hellaswag", 100, NEWER, {"acc": [0, 0, 1]}, doc_ids=[5, 2, 9],
                       mtime_ns=2_000_000_000)
    write_task_samples(tmp_path, "fast", "arc_easy", 100, IDENTITY, {"acc": [1.0], "acc_norm": [0.0]})
    files = list_samples(tmp_path, suite="fast", task="hellaswag", step=100)
    assert [f.identity12 for f in files] == [identity_hash(IDENTITY)[:12], identity_hash(NEWER)[:12]]
    now = current(list_samples(tmp_path))
    assert sorted(now) == [("fast", "arc_easy", 100), ("fast", "hellaswag", 100)]
    newest = now[("fast", "hellaswag", 100)]
    assert read_sidecar(newest).identity == NEWER
    samples = read_samples(newest)
    assert samples.doc_ids.tolist() == [2, 5, 9] and samples.metrics["acc"].tolist() == [0, 0, 1]
    assert list_samples(tmp_path / "nowhere") == []


def _write_raw(tmp_path, lines: list[bytes] | bytes, sidecar: dict | bytes | None = None):
    digest = identity_hash(IDENTITY)
    folder = tmp_path / "samples" / "fast" / "hellaswag"
    folder.mkdir(parents=True, exist_ok=True)
    data = lines if isinstance(lines, bytes) else gzip.compress(b"".join(lines))
    (folder / f"step_7.{digest[:12]}.jsonl.gz").write_bytes(data)
    side = sidecar if sidecar is not None else {"identity": IDENTITY, "identity_sha256": digest, "metrics": {}}
    (folder / f"step_7.{digest[:12]}.json").write_bytes(side if isinstance(side, bytes) else json.dumps(side).encode())
    return list_samples(tmp_path)[0]


def _doc(**fields) -> bytes:
    return json.dumps({"doc_id": 0, "target": "", "resps": [], "metrics": {"acc": 1}, **fields}).encode() + b"\n"


@pytest.mark.parametrize("lines,message", [
    ([b"{not json\n"], r"line 1: not JSON"),
    ([_doc(), b"[1, 2]\n"], r"line 2: a document is a JSON object"),
    ([_doc(doc_id="3")], r"line 1: 'doc_id' must be an integer"),
    ([_doc(doc_id=True)], r"line 1: 'doc_id' must be an integer"),
    ([_doc(doc_id=-1)], r"'doc_id' must be an integer in \[0, 2\*\*53\]"),
    ([_doc(metrics={})], r"'metrics' must be a non-empty object"),
    ([_doc(metrics={"acc": "1"})], r"metric 'acc' must be a finite number or a \[loglikelihood, weight\] pair"),
    ([_doc(metrics={"acc": True})], r"metric 'acc' must be a finite number"),
    ([b'{"doc_id": 0, "metrics": {"acc": NaN}}\n'], r"line 1: not strict JSON: NaN is not a JSON value"),
    ([_doc(metrics={"bits_per_byte": [1, 2, 3]})], r"metric 'bits_per_byte' must be"),
    ([_doc(), _doc()], r"doc_id 0 appears more than once"),
    ([_doc(), _doc(doc_id=1, metrics={"acc": 1, "acc_norm": 0})], r"metric 'acc_norm' is on 1 of 2 documents"),
    ([_doc(metrics={"x": 1}), _doc(doc_id=1, metrics={"x": [1, 2]})], r"a number on some documents and a pair"),
    ([], r"no documents"),
])
def test_a_malformed_samples_file_is_refused_naming_the_file_and_line(tmp_path, lines, message):
    found = _write_raw(tmp_path, lines)
    with pytest.raises(SampleFileError, match=message) as caught:
        read_samples(found)
    assert str(found.samples) in str(caught.value)


def test_a_truncated_gzip_a_link_and_the_bounds_are_refused(tmp_path, monkeypatch):
    whole = gzip.compress(_doc() * 1)
    found = _write_raw(tmp_path, whole[:-6])
    with pytest.raises(SampleFileError, match="not a complete gzip file"):
        read_samples(found)
    found.samples.unlink()
    target = tmp_path / "elsewhere.jsonl.gz"
    target.write_bytes(whole)
    os.symlink(target, found.samples)
    with pytest.raises(SampleFileError, match="symbolic link is not followed"):
        read_samples(found)
    found.samples.unlink()
    found.samples.write_bytes(gzip.compress(b"".join(_doc(doc_id=i) for i in range(5))))
    monkeypatch.setattr(samples_module, "MAX_DOCUMENTS", 4)
    with pytest.raises(SampleFileError, match="more than 4 documents"):
        read_samples(found)
    monkeypatch.setattr(samples_module, "MAX_LINE_BYTES", 40)
    with pytest.raises(SampleFileError, match="line 1: longer than 40 bytes"):
        read_samples(found)


@pytest.mark.parametrize("sidecar,message", [
    (b"{", ": not JSON"),
    ([1], "a sidecar is a JSON object"),
    ({"identity": [], "identity_sha256": "0" * 64, "metrics": {}}, "'identity' must be an object"),
    ({"identity": {}, "identity_sha256": "XYZ", "metrics": {}}, "'identity_sha256' must be 64 lowercase hex"),
    ({"identity": {}, "identity_sha256": "f" * 64, "metrics": {}}, "its name says identity"),
    ({"identity": {}, "identity_sha256": identity_hash(IDENTITY), "metrics": 3}, "'metrics' must be an object"),
    ({"identity": {}, "identity_sha256": identity_hash(IDENTITY), "metrics": {}, "cell_identity": 5},
     "'cell_identity' must be a string"),
])
def test_a_malformed_sidecar_is_refused_naming_it(tmp_path, sidecar, message):
    found = _write_raw(tmp_path, [_doc()], sidecar)
    with pytest.raises(SampleFileError, match=message) as caught:
        read_sidecar(found)
    assert str(found.sidecar) in str(caught.value)


def test_a_sidecar_naming_its_hash_identity_hash_is_read_too(tmp_path):
    digest = identity_hash(IDENTITY)
    found = _write_raw(tmp_path, [_doc()], {"identity": IDENTITY, "identity_hash": digest, "metrics": {"acc": 1.0},
                                                  "suite": "fast", "task": "hellaswag", "step": 7})
    sidecar = read_sidecar(found)
    assert sidecar.identity_hash == digest and sidecar.identity == IDENTITY and sidecar.cell_identity is None
    assert read_samples(found).metrics["acc"].tolist() == [1.0]


DOCUMENTS = [{"doc_id": 3, "target": "b", "resps": [[-1.5, False], [-0.5, True]], "metrics": {"acc": 1.0}},
             {"doc_id": 1, "target": "a" * 50, "resps": [[-0.25, True], [-2.0, False]], "metrics": {"acc": 0.0}}]


def _write(run_dir, step=7, cell="c" * 64, samples=DOCUMENTS):
    return write_samples(run_dir, suite="fast", task="t", step=step, identity=IDENTITY,
                         identity_sha256=identity_hash(IDENTITY), cell_identity=cell, metrics={"acc": 0.5},
                         samples=samples)


def test_what_the_writer_writes_the_reader_reads_back_whole(tmp_path):
    path = _write(tmp_path)
    assert path == samples_paths(tmp_path, "fast", "t", 7, identity_hash(IDENTITY))[0]
    head, documents = read_step(tmp_path, "fast", "t", 7)
    assert documents == sorted(DOCUMENTS, key=lambda d: d["doc_id"])
    assert head.identity == IDENTITY and head.identity_hash == identity_hash(IDENTITY)
    assert head.metrics == {"acc": 0.5} and head.cell_identity == "c" * 64
    found = find_samples(tmp_path, "fast", "t", 7, identity=identity_hash(IDENTITY)[:8].upper())
    assert read_documents(found) == documents and read_samples(found).doc_ids.tolist() == [1, 3]
    first = path.read_bytes()
    _write(tmp_path)
    assert path.read_bytes() == first   # deterministic
    with pytest.raises(SamplesNotFound, match="step 8"):
        read_step(tmp_path, "fast", "t", 8)
    with pytest.raises(SamplesNotFound, match="with identity ffffffffffff"):
        read_step(tmp_path, "fast", "t", 7, identity="f" * 64)


def test_another_cell_identity_keeps_the_old_pair_superseded(tmp_path):
    path = _write(tmp_path)
    _write(tmp_path, cell="d" * 64)
    assert path.with_name(f"{path.name}.superseded-{'c' * 12}").exists()
    assert read_step(tmp_path, "fast", "t", 7)[0].cell_identity == "d" * 64
    _, sidecar = samples_paths(tmp_path, "fast", "t", 7, identity_hash(IDENTITY))
    sidecar.write_bytes(b"{torn")   # an unreadable old sidecar: nothing to keep, rewritten
    _write(tmp_path, cell="e" * 64)
    assert read_step(tmp_path, "fast", "t", 7)[0].cell_identity == "e" * 64


def test_a_caller_of_the_whole_documents_gets_an_error_naming_the_file_and_line(tmp_path):
    """read_step (formerly ``read_samples(run_dir, ...)``, unvalidated: a JSONDecodeError naming neither the
    file nor the line, or an EOFError from gzip) is the validated reader now."""
    path = _write(tmp_path)
    whole = gzip.decompress(path.read_bytes())
    path.write_bytes(gzip.compress(whole + b"{not json\n"))
    with pytest.raises(SampleFileError, match=r"line 3: not JSON") as caught:
        read_step(tmp_path, "fast", "t", 7)
    assert f"{path} line 3" in str(caught.value)
    path.write_bytes(gzip.compress(whole + b'{"doc_id": "x", "metrics": {}}\n'))
    with pytest.raises(SampleFileError, match=rf"{path} line 3: 'doc_id' must be an integer"):
        read_step(tmp_path, "fast", "t", 7)
    path.write_bytes(gzip.compress(whole + whole))
    with pytest.raises(SampleFileError, match="doc_id 1 appears more than once"):
        read_step(tmp_path, "fast", "t", 7)
    path.write_bytes(gzip.compress(whole)[:-6])
    with pytest.raises(SampleFileError, match="not a complete gzip file"):
        read_step(tmp_path, "fast", "t", 7)
    _, sidecar = samples_paths(tmp_path, "fast", "t", 7, identity_hash(IDENTITY))
    sidecar.write_bytes(b"[]")
    with pytest.raises(SampleFileError, match=f"{sidecar}: a sidecar is a JSON object"):
        read_step(tmp_path, "fast", "t", 7)


def test_whole_documents_keep_metrics_the_arrays_cannot_hold(tmp_path):
    """lm-eval may give a document a non-numeric metric; the whole documents keep it, the arrays refuse it."""
    _write(tmp_path, samples=[{"doc_id": 0, "target": "", "resps": [], "metrics": {"acc": True, "note": None}}])
    assert read_step(tmp_path, "fast", "t", 7)[1][0]["metrics"] == {"acc": True, "note": None}
    with pytest.raises(SampleFileError, match="metric 'acc' must be a finite number"):
        read_samples(find_samples(tmp_path, "fast", "t", 7))
