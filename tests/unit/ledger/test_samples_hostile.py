"""Per-sample files as hostile input (issue 27, items 3, 8, 9, 17): strict JSON both ways (no NaN or
Infinity literals written or read), nesting bounded, numbers Python cannot turn into floats refused,
a sidecar's identity hash recomputed and its step, suite and task checked against its file name; each
refusal a SampleFileError naming the file (and line), never a traceback of another type."""

from __future__ import annotations

import gzip
import json

import pytest

from evald.cli.main import main
from evald.ledger import samples as samples_module
from evald.ledger.samples import (SampleFileError, find_samples, list_samples, read_documents, read_samples,
                                  read_sidecar, read_step, samples_paths, write_samples)
from tests.sample_outputs import IDENTITY, identity_hash, write_task_samples

DIGEST = identity_hash(IDENTITY)
MAX_DEPTH = getattr(samples_module, "MAX_DEPTH", 64)   # (main had no bound)


def _pair(run_dir, lines: list[bytes], sidecar: dict | bytes | None = None, step: int = 7):
    """A samples file and its sidecar under ``samples/fast/hellaswag``, written raw."""
    folder = run_dir / "samples" / "fast" / "hellaswag"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"step_{step}.{DIGEST[:12]}.jsonl.gz").write_bytes(gzip.compress(b"".join(lines)))
    side = sidecar if sidecar is not None else _sidecar(step=step)
    (folder / f"step_{step}.{DIGEST[:12]}.json").write_bytes(side if isinstance(side, bytes)
                                                             else json.dumps(side).encode())
    return next(f for f in list_samples(run_dir) if f.step == step)


def _sidecar(**fields) -> dict:
    return {"suite": "fast", "task": "hellaswag", "step": 7, "identity": IDENTITY, "identity_sha256": DIGEST,
            "cell_identity": "ce" * 32, "metrics": {"acc": 1.0}, "documents": 1, **fields}


DOC = b'{"doc_id": 0, "target": "", "resps": [], "metrics": {"acc": 1}}\n'


# -- item 3: strict JSON ------------------------------------------------------------------------------

@pytest.mark.parametrize("literal", [b"NaN", b"Infinity", b"-Infinity"])
def test_a_non_standard_literal_in_a_line_is_refused_naming_the_file_and_line(tmp_path, literal):
    found = _pair(tmp_path, [DOC, b'{"doc_id": 1, "resps": [[' + literal + b', false]], "metrics": {"acc": 0}}\n'])
    for read in (read_samples, read_documents):
        with pytest.raises(SampleFileError, match=rf"line 2: not strict JSON: {literal.decode()}") as caught:
            read(found)
        assert f"{found.samples} line 2" in str(caught.value)


def test_a_non_standard_literal_in_a_sidecar_is_refused_naming_it(tmp_path):
    found = _pair(tmp_path, [DOC], json.dumps(_sidecar(metrics={"acc": float("nan")})).encode())
    with pytest.raises(SampleFileError, match="not strict JSON: NaN") as caught:
        read_sidecar(found)
    assert str(found.sidecar) in str(caught.value)


def test_the_writer_writes_strict_json_and_flags_what_was_not_finite(tmp_path):
    """Nothing non-finite should reach the writer (a non-finite log-likelihood fails the cell), but if a
    value does, it is written as null and named in the document's (or sidecar's) ``nonfinite`` list."""
    documents = [{"doc_id": 0, "target": "a", "resps": [[float("nan"), False], [-1.0, True]],
                  "metrics": {"acc": 1.0, "ppl": float("inf")}},
                 {"doc_id": 1, "target": "b", "resps": [[-2.0, True]], "metrics": {"acc": 0.0, "ppl": 3.0}}]
    data = write_samples(tmp_path, suite="fast", task="t", step=7, identity=IDENTITY, identity_sha256=DIGEST,
                         cell_identity="c" * 64, metrics={"acc": 0.5, "ppl": float("-inf")}, samples=documents)
    lines = gzip.decompress(data.read_bytes()).decode().splitlines()
    for line in lines:
        json.loads(line, parse_constant=lambda name: pytest.fail(f"{name} written"))
    first = json.loads(lines[0])
    assert first["resps"][0] == [None, False] and first["metrics"]["ppl"] is None
    assert first["nonfinite"] == ["metrics.ppl", "resps.0.0"]
    assert "nonfinite" not in json.loads(lines[1])
    sidecar = samples_paths(tmp_path, "fast", "t", 7, DIGEST)[1]
    head = json.loads(sidecar.read_text(), parse_constant=lambda name: pytest.fail(f"{name} written"))
    assert head["metrics"] == {"acc": 0.5, "ppl": None} and head["nonfinite"] == ["metrics.ppl"]
    side, docs = read_step(tmp_path, "fast", "t", 7)      # the whole documents read back, flags and all
    assert docs[0]["nonfinite"] == ["metrics.ppl", "resps.0.0"] and side.metrics["ppl"] is None
    with pytest.raises(SampleFileError, match=r"line 1: metric 'ppl' must be a finite number"):
        read_samples(find_samples(tmp_path, "fast", "t", 7))   # the arrays never hold it


# -- item 9: nesting and numbers ----------------------------------------------------------------------

@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 100_000])
def test_deep_nesting_in_a_line_is_refused_not_a_recursion_error(tmp_path, depth):
    deep = b"[" * depth + b"]" * depth
    found = _pair(tmp_path, [DOC, b'{"doc_id": 1, "metrics": {"acc": 0}, "resps": ' + deep + b"}\n"])
    for read in (read_samples, read_documents):
        with pytest.raises(SampleFileError, match=rf"line 2: nested more than {MAX_DEPTH} levels deep"):
            read(found)


def test_nesting_within_the_bound_is_read(tmp_path):
    inner = MAX_DEPTH - 2     # the document itself is one level, "resps" the next
    found = _pair(tmp_path, [b'{"doc_id": 0, "metrics": {"acc": 1}, "resps": ' + b"[" * inner + b"]" * inner
                             + b', "target": "[[[{{{\\"]]]"}\n'])
    assert read_documents(found)[0]["target"] == '[[[{{{"]]]'   # brackets inside strings do not count


def test_deep_nesting_in_a_sidecar_is_refused_not_a_recursion_error(tmp_path):
    deep = b'{"a":' * 100_000 + b"1" + b"}" * 100_000
    raw = json.dumps(_sidecar(identity={"x": 1})).encode().replace(b'{"x": 1}', deep)
    found = _pair(tmp_path, [DOC], raw)
    with pytest.raises(SampleFileError, match=f"nested more than {MAX_DEPTH} levels deep") as caught:
        read_sidecar(found)
    assert str(found.sidecar) in str(caught.value)


@pytest.mark.parametrize("value", [b"1" + b"0" * 400, b"1e999", b"-" + b"9" * 5000, b"[1e400, 1]"])
def test_a_number_no_float_holds_is_refused_naming_the_line(tmp_path, value):
    found = _pair(tmp_path, [DOC, b'{"doc_id": 1, "resps": [], "metrics": {"acc": ' + value + b"}}\n"])
    with pytest.raises(SampleFileError, match=r"line 2: "):
        read_samples(found)


@pytest.mark.parametrize("value,message", [(10**400, r"sidecar metric 'acc' must be a finite number"),
                                           ("0.5", r"sidecar metric 'acc' must be a finite number"),
                                           ([1, 2], r"sidecar metric 'acc' must be a finite number")])
def test_a_sidecar_metric_no_float_holds_is_refused(tmp_path, value, message):
    """10**400 made `evald compare` raise OverflowError comparing it with the per-sample mean."""
    found = _pair(tmp_path, [DOC], json.dumps(_sidecar(metrics={"acc": value})).encode())
    with pytest.raises(SampleFileError, match=message) as caught:
        read_sidecar(found)
    assert str(found.sidecar) in str(caught.value)


# -- items 8 and 17: the sidecar's own claims ---------------------------------------------------------

def test_an_identity_edited_under_its_old_hash_is_refused_naming_the_file(tmp_path):
    edited = {**IDENTITY, "num_fewshot": 5, "lm_eval": "0.4.99"}
    found = _pair(tmp_path, [DOC], _sidecar(identity=edited))
    with pytest.raises(SampleFileError, match=r"its identity hashes to [0-9a-f]{12}, not the "
                                              rf"identity_sha256 it states \({DIGEST[:12]}") as caught:
        read_sidecar(found)
    assert str(found.sidecar) in str(caught.value)


@pytest.mark.parametrize("field,value", [("step", 8), ("suite", "slow"), ("task", "arc_easy"), ("step", "7"),
                                         ("step", None), ("suite", None)])
def test_a_sidecar_whose_step_suite_or_task_disagrees_with_its_name_is_refused(tmp_path, field, value):
    side = _sidecar(**{field: value})
    if value is None:
        del side[field]
    found = _pair(tmp_path, [DOC], side)
    with pytest.raises(SampleFileError, match=rf"its {field} is {json.dumps(value) if value is not None else 'missing'}"
                                              rf".*its name says {found.step if field == 'step' else '.*'}") as caught:
        read_sidecar(found)
    assert str(found.sidecar) in str(caught.value)


def test_the_writer_and_the_reader_agree_on_the_identity_hash(tmp_path):
    identity = {**IDENTITY, "name": "é ☃ \U0001f600", "max_length": 64, "ratio": 0.1, "nested": {"b": [1, 2.5]}}
    write_task_samples(tmp_path, "fast", "t", 3, identity, {"acc": [1, 0]})
    (found,) = list_samples(tmp_path)
    assert read_sidecar(found).identity == identity


# -- the same through `evald compare`: exit 2 with the file named, never a traceback --------------------

def _run(tmp_path):
    run = tmp_path / "run"
    for step in (100, 200):
        write_task_samples(run, "fast", "hellaswag", step, IDENTITY, {"acc": [1, 0, 1, 1]})
    return run


def _compare(capsys, run) -> tuple[int, str]:
    code = main(["compare", "100", "200", "--run-dir", str(run), "--resamples", "20"])
    return code, capsys.readouterr().err


def test_compare_refuses_an_edited_identity_under_its_old_hash(tmp_path, capsys):
    run = _run(tmp_path)
    assert _compare(capsys, run)[0] == 0
    sidecar = next((run / "samples" / "fast" / "hellaswag").glob("step_200.*.json"))
    head = json.loads(sidecar.read_text())
    head["identity"]["num_fewshot"], head["identity"]["lm_eval"] = 5, "0.4.99"
    sidecar.write_text(json.dumps(head))
    code, err = _compare(capsys, run)
    assert code == 2 and str(sidecar) in err and "not the identity_sha256 it states" in err


def test_compare_refuses_a_sidecar_copied_under_another_step(tmp_path, capsys):
    run = _run(tmp_path)
    folder = run / "samples" / "fast" / "hellaswag"
    old = next(folder.glob("step_200.*.json"))
    new = folder / old.name.replace("step_200.", "step_300.")
    new.write_bytes(old.read_bytes())
    (folder / new.name.replace(".json", ".jsonl.gz")).write_bytes(old.with_name(old.name[:-5] + ".jsonl.gz")
                                                                  .read_bytes())
    code = main(["compare", "100", "300", "--run-dir", str(run), "--resamples", "20"])
    err = capsys.readouterr().err
    assert code == 2 and str(new) in err and "its step is 200" in err


@pytest.mark.parametrize("where", ["line", "sidecar"])
def test_compare_refuses_deep_nesting_with_exit_2(tmp_path, capsys, where):
    run = _run(tmp_path)
    folder = run / "samples" / "fast" / "hellaswag"
    sidecar = next(folder.glob("step_200.*.json"))
    samples = sidecar.with_name(sidecar.name[:-5] + ".jsonl.gz")
    deep = b"[" * 100_000 + b"]" * 100_000
    if where == "line":
        samples.write_bytes(gzip.compress(b'{"doc_id": 9, "metrics": {"acc": 1}, "resps": ' + deep + b"}\n"))
        named = samples
    else:
        sidecar.write_bytes(sidecar.read_bytes().replace(b'"metrics": {', b'"deep": ' + deep + b', "metrics": {', 1))
        named = sidecar
    code, err = _compare(capsys, run)
    assert code == 2 and str(named) in err and "nested more than" in err
