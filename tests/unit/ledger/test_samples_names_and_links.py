"""Per-sample files as hostile input, fourth round (issue 35): suite and task names that are paths (a
backfill fleet's merge feeds names from untrusted cell files into the writer), a lone surrogate escape
that JSON's reader accepts and every UTF-8 writer then refuses, and links anywhere below the run
directory on the way to a file that is read. Each refusal a SampleFileError naming what and where."""

from __future__ import annotations

import gzip
import json
import os
import shutil

import pytest

from evald.cli.main import main
from evald.ledger.samples import (SampleFileError, list_samples, read_documents, read_samples, read_sidecar,
                                  read_step, write_samples)
from evald.sinks.sample_files import paired_se_of_monitor
from tests.sample_outputs import IDENTITY, identity_hash, write_task_samples

DIGEST = identity_hash(IDENTITY)


def _write(run_dir, suite: str = "fast", task: str = "hellaswag", digest: str = DIGEST):
    return write_samples(run_dir, suite=suite, task=task, step=7, identity=IDENTITY, identity_sha256=digest,
                         cell_identity="ce" * 32, metrics={"acc": 1.0},
                         samples=[{"doc_id": 0, "target": "a", "resps": [], "metrics": {"acc": 1}}])


def _everything_below(path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


# -- names that are paths -----------------------------------------------------------------------------

BAD_NAMES = ["../../escaped", "..", ".", "a/b", "/abs", "a\\b", ".hidden", "", "a\x00b", "a\nb", "tab\there",
             "\u202eevil", " padded", "x" * 201, "lone\ud800"]


@pytest.mark.parametrize("name", BAD_NAMES)
@pytest.mark.parametrize("which", ["suite", "task"])
def test_a_suite_or_task_name_that_is_no_plain_name_is_refused_before_anything_is_written(tmp_path, name, which):
    run_dir = tmp_path / "deep" / "run"
    run_dir.mkdir(parents=True)
    names = {"suite": "fast", "task": "hellaswag", which: name}
    with pytest.raises(SampleFileError, match=rf"the {which} name .* is not a plain name \("):
        _write(run_dir, **names)
    assert _everything_below(tmp_path) == ["deep", "deep/run"]           # nothing inside or outside


@pytest.mark.parametrize("digest", ["../../../../escaped" + "0" * 50, "AB" * 32, "ab" * 31])
def test_an_identity_hash_that_is_no_hash_is_refused_before_anything_is_written(tmp_path, digest):
    """The hash's first 12 characters name the files: from a fleet's cell file, it is input too."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with pytest.raises(SampleFileError, match="identity_sha256 must be 64 lowercase hex digits"):
        _write(run_dir, digest=digest)
    assert _everything_below(tmp_path) == ["run"]


@pytest.mark.parametrize("name", ["hellaswag", "mmlu_abstract_algebra", "arc-easy", "bpb.v2", "gsm8k+cot", "é☃"])
def test_plain_names_are_written_and_read_back(tmp_path, name):
    _write(tmp_path, task=name)
    side, docs = read_step(tmp_path, "fast", name, 7)
    assert side.identity == IDENTITY and docs[0]["target"] == "a"


def test_reading_under_a_name_that_is_a_path_finds_nothing_outside(tmp_path):
    """``evald export`` asks for the tasks its ledger names: a name that climbs out finds no file there."""
    _write(tmp_path / "run")
    _write(tmp_path / "other")
    with pytest.raises(SampleFileError, match="not a plain name"):
        read_step(tmp_path / "run", "fast", "../../other/samples/fast/hellaswag", 7)


# -- a lone surrogate ---------------------------------------------------------------------------------

def _pair(run_dir, line: bytes, sidecar: bytes | None = None):
    write_task_samples(run_dir, "fast", "hellaswag", 7, IDENTITY, {"acc": [1, 0]})
    (found,) = list_samples(run_dir)
    found.samples.write_bytes(gzip.compress(b'{"doc_id": 0, "target": "", "resps": [], "metrics": {"acc": 1}}\n'
                                            + line))
    if sidecar is not None:
        found.sidecar.write_bytes(sidecar)
    return found


LONE = [b'{"doc_id": 1, "target": "\\ud800", "resps": [], "metrics": {"acc": 0}}\n',
        b'{"doc_id": 1, "target": "x\\uDFFFy", "resps": [], "metrics": {"acc": 0}}\n',
        b'{"doc_id": 1, "target": "", "resps": [["\\ude00\\ud83d"]], "metrics": {"acc": 0}}\n',   # a pair reversed
        b'{"doc_id": 1, "target": "\\\\ud83d\\ude00", "resps": [], "metrics": {"acc": 0}}\n',   # "\\" then a low half
        b'{"doc_id": 1, "target": "", "resps": [], "\\ud800": 1, "metrics": {"acc": 0}}\n',
        b'{"doc_id": 1, "target": "", "resps": [], "metrics": {"acc": 0, "\\udbff": 1}}\n']


@pytest.mark.parametrize("line", LONE)
def test_a_lone_surrogate_in_a_line_is_refused_naming_the_file_and_line(tmp_path, line):
    found = _pair(tmp_path, line)
    for read in (read_samples, read_documents):
        with pytest.raises(SampleFileError, match="lone surrogate escape") as caught:
            read(found)
        assert f"{found.samples} line 2" in str(caught.value)
        str(caught.value).encode("utf-8")           # the message itself is printable


def test_a_lone_surrogate_in_a_sidecar_is_refused_naming_it(tmp_path):
    write_task_samples(tmp_path, "fast", "hellaswag", 7, IDENTITY, {"acc": [1, 0]})
    (found,) = list_samples(tmp_path)
    head = json.loads(found.sidecar.read_text())
    head["identity"]["tokenizer"] = "\ud800"
    head["identity_sha256"] = identity_hash(head["identity"])   # even under its recomputed hash (json escapes it)
    found.sidecar.write_text(json.dumps(head))
    (found,) = list_samples(tmp_path)
    with pytest.raises(SampleFileError, match="identity.tokenizer holds a lone surrogate escape") as caught:
        read_sidecar(found)
    assert str(found.sidecar) in str(caught.value)


@pytest.mark.parametrize("text", [b"\\ud83d\\ude00", "\U0001f600".encode(), b"\\\\ud800", b"\\u00e9"])
def test_paired_surrogates_real_characters_and_an_escaped_backslash_are_read(tmp_path, text):
    found = _pair(tmp_path, b'{"doc_id": 1, "target": "' + text + b'", "resps": [], "metrics": {"acc": 0}}\n')
    target = read_documents(found)[1]["target"]
    assert target in ("\U0001f600", "\\ud800", "é") and target.encode("utf-8")


def test_compare_exits_2_naming_the_line_with_a_lone_surrogate(tmp_path, capsys):
    run = tmp_path / "run"
    for step in (100, 200):
        write_task_samples(run, "fast", "hellaswag", step, IDENTITY, {"acc": [1, 0, 1, 1]})
    samples = next((run / "samples" / "fast" / "hellaswag").glob("step_200.*.jsonl.gz"))
    samples.write_bytes(gzip.compress(b'{"doc_id": 0, "target": "\\ud800", "resps": [], "metrics": {"acc": 1}}\n'))
    code = main(["compare", "100", "200", "--run-dir", str(run), "--resamples", "20"])
    err = capsys.readouterr().err
    assert code == 2 and f"{samples} line 1" in err and "lone surrogate" in err


def test_the_suite_monitor_falls_back_to_its_unpaired_rule_on_a_lone_surrogate(tmp_path):
    write_task_samples(tmp_path, "fast", "hellaswag", 10, IDENTITY, {"acc": [1, 0, 1, 1]})
    write_task_samples(tmp_path, "fast", "hellaswag", 20, IDENTITY, {"acc": [1, 1, 1, 0]})
    assert paired_se_of_monitor(tmp_path, "fast/hellaswag/acc", 20, 10).value is not None
    samples = next((tmp_path / "samples" / "fast" / "hellaswag").glob("step_10.*.jsonl.gz"))
    samples.write_bytes(gzip.compress(b'{"doc_id": 0, "target": "\\udc00", "resps": [], "metrics": {"acc": 1}}\n'))
    found = paired_se_of_monitor(tmp_path, "fast/hellaswag/acc", 20, 10)
    assert found.value is None and "lone surrogate" in found.reason and str(samples) in found.reason


# -- links below the run directory ---------------------------------------------------------------------

def test_a_directory_swapped_for_a_link_after_listing_is_not_read_through(tmp_path):
    """A file is found, then its task directory is replaced by a link to a directory holding a file of
    the same name: the read refuses the link instead of reading the other file."""
    run = tmp_path / "run"
    write_task_samples(run, "fast", "hellaswag", 7, IDENTITY, {"acc": [1, 0]})
    (found,) = list_samples(run)
    elsewhere = tmp_path / "elsewhere"
    shutil.move(run / "samples" / "fast" / "hellaswag", elsewhere)
    (run / "samples" / "fast" / "hellaswag").symlink_to(elsewhere)
    for read in (read_sidecar, read_samples):
        with pytest.raises(SampleFileError, match="is a symbolic link, not a directory") as caught:
            read(found)
        assert "hellaswag" in str(caught.value)


@pytest.mark.parametrize("linked", ["samples", "samples/fast", "samples/fast/hellaswag"])
def test_a_link_on_the_way_is_never_followed(tmp_path, linked):
    run = tmp_path / "run"
    write_task_samples(tmp_path / "other", "fast", "hellaswag", 7, IDENTITY, {"acc": [1, 0]})
    (run / linked).parent.mkdir(parents=True, exist_ok=True)
    (run / linked).symlink_to(tmp_path / "other" / linked)
    try:
        found = list_samples(run)
    except SampleFileError as exc:          # samples/ itself a link: said, not followed
        assert "samples" in str(exc) and "symbolic link" in str(exc)
        return
    assert found == []                      # a link in place of a suite or task directory is no directory


def test_a_hard_linked_samples_file_is_refused(tmp_path):
    run = tmp_path / "run"
    write_task_samples(run, "fast", "hellaswag", 7, IDENTITY, {"acc": [1, 0]})
    (found,) = list_samples(run)
    os.link(found.samples, tmp_path / "second-name")
    with pytest.raises(SampleFileError, match="hard link"):
        read_samples(found)


@pytest.mark.parametrize("linked", ["samples", "samples/fast", "samples/fast/hellaswag"])
def test_the_writer_does_not_write_through_a_link_in_the_run_directory(tmp_path, linked):
    run, outside = tmp_path / "run", tmp_path / "outside"
    outside.mkdir()
    (run / linked).parent.mkdir(parents=True, exist_ok=True)
    (run / linked).symlink_to(outside)
    with pytest.raises(SampleFileError, match="are not written: .*symbolic link"):
        _write(run)
    assert _everything_below(outside) == []


def test_a_step_in_other_digits_is_no_per_sample_file(tmp_path):
    """``step_\\u0667`` is no name evald writes, yet int() reads its Arabic-Indic digit as 7: listed, the newer
    file would be step 7's current one in place of evald's own."""
    _write(tmp_path)
    (real,) = list_samples(tmp_path)
    shutil.copy(real.sidecar, real.sidecar.with_name(real.sidecar.name.replace("step_7", "step_\u0667")))
    assert [f.sidecar for f in list_samples(tmp_path)] == [real.sidecar]
