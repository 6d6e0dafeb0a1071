"""Reading the per-sample outputs back: the current identity, validation with the file named, bounds,
and the paired SE a suite monitor uses."""

from __future__ import annotations

import gzip
import json
import os

import numpy as np
import pytest

from evald.decisions.paired import paired_se
from evald.sinks import sample_files
from evald.sinks.sample_files import (SampleFileError, current, list_samples, paired_se_of_monitor, read_samples,
                                      read_sidecar)
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
    side = sidecar if sidecar is not None else {"identity": IDENTITY, "identity_hash": digest, "metrics": {}}
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
    ([b'{"doc_id": 0, "metrics": {"acc": NaN}}\n'], r"metric 'acc' must be a finite number"),
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
    monkeypatch.setattr(sample_files, "MAX_DOCUMENTS", 4)
    with pytest.raises(SampleFileError, match="more than 4 documents"):
        read_samples(found)
    monkeypatch.setattr(sample_files, "MAX_LINE_BYTES", 40)
    with pytest.raises(SampleFileError, match="line 1: longer than 40 bytes"):
        read_samples(found)


@pytest.mark.parametrize("sidecar,message", [
    (b"{", "is not JSON"),
    ({"identity": [], "identity_hash": "0" * 64, "metrics": {}}, "'identity' must be an object"),
    ({"identity": {}, "identity_hash": "XYZ", "metrics": {}}, "'identity_hash' must be 64 lowercase hex"),
    ({"identity": {}, "identity_hash": "f" * 64, "metrics": {}}, "its name says identity"),
    ({"identity": {}, "identity_hash": identity_hash(IDENTITY), "metrics": 3}, "'metrics' must be an object"),
])
def test_a_malformed_sidecar_is_refused_naming_it(tmp_path, sidecar, message):
    found = _write_raw(tmp_path, [_doc()], sidecar)
    with pytest.raises(SampleFileError, match=message) as caught:
        read_sidecar(found)
    assert str(found.sidecar) in str(caught.value)


def test_the_paired_se_of_a_suite_monitor_comes_from_both_steps_documents(tmp_path):
    rng = np.random.default_rng(0)
    a = (rng.random(80) < 0.5).astype(int)
    b = np.where(rng.random(80) < 0.8, a, 1 - a)
    write_task_samples(tmp_path, "fast", "hellaswag", 10, IDENTITY, {"acc_norm": a.tolist()})
    write_task_samples(tmp_path, "fast", "hellaswag", 20, IDENTITY, {"acc_norm": b.tolist()})
    found = paired_se_of_monitor(tmp_path, "fast/hellaswag/acc_norm", 20, 10)
    assert found.value == pytest.approx(paired_se("acc_norm", a, b)) and found.value > 0
    assert "paired over 80 documents" in found.reason
    assert paired_se_of_monitor(tmp_path, "eval/loss", 20, 10).value is None
    assert paired_se_of_monitor(tmp_path, "fast/hellaswag/acc_norm", 20, None).value is None
    missing = paired_se_of_monitor(tmp_path, "fast/hellaswag/acc_norm", 30, 10)
    assert missing.value is None and "step 30 has no per-sample outputs" in missing.reason
    write_task_samples(tmp_path, "fast", "hellaswag", 30, NEWER, {"acc_norm": b.tolist()})
    other = paired_se_of_monitor(tmp_path, "fast/hellaswag/acc_norm", 30, 10)
    assert other.value is None and "different identities" in other.reason
    broken = list_samples(tmp_path, step=20)[0].samples
    broken.write_bytes(b"garbage")
    bad = paired_se_of_monitor(tmp_path, "fast/hellaswag/acc_norm", 20, 10)
    assert bad.value is None and str(broken) in bad.reason


def test_a_sidecar_naming_its_hash_identity_sha256_is_read_too(tmp_path):
    digest = identity_hash(IDENTITY)
    found = _write_raw(tmp_path, [_doc()], {"identity": IDENTITY, "identity_sha256": digest, "metrics": {"acc": 1.0},
                                            "cell_identity": "ab" * 32, "documents": 1})
    sidecar = read_sidecar(found)
    assert sidecar.identity_hash == digest and sidecar.identity == IDENTITY
    assert read_samples(found).metrics["acc"].tolist() == [1.0]
