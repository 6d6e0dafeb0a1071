"""`evald export`'s writers on a hand-made cell: lm-eval's files and its task hash, Every Eval Ever's
published schemas (vendored in tests/data/every_eval_ever), Hugging Face .eval_results YAML."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import yaml

from evald.sinks import every_eval_ever, hf_eval_results, lm_eval_files
from evald.sinks.export_cells import ExportCell, ExportTask, lm_eval_key, stable_uuid4
from evald.sinks.export_target import open_target

EEE = Path(__file__).resolve().parents[2] / "data" / "every_eval_ever"


def _hash(text: str) -> str:
    from lm_eval.utils import hash_string

    return hash_string(text)


def _cell(step: int = 300, with_hashes: bool = True) -> ExportCell:
    samples = []
    for doc_id, acc in ((4, 1.0), (1, 0.0), (7, 1.0)):
        sample = {"doc_id": doc_id, "target": "2", "resps": [[-1.5, False], [-0.5, True]],
                  "metrics": {"acc": acc, "ll": [-1.5, 3]}}
        if with_hashes:
            sample.update(doc_hash=_hash(f"doc{doc_id}"), prompt_hash=_hash(f"p{doc_id}"), target_hash=_hash("2"))
        samples.append(sample)
    task = ExportTask("next_line", {"acc": 2 / 3, "acc_stderr": 0.33, "acc@strict": 0.5, "ll": -1.2},
                      samples, {"task": "next_line", "num_fewshot": 0, "dataset_path": "json"}, 1, 0,
                      {"acc": True, "ll": True}, 12, {1: {"q": "a"}, 4: {"q": "b"}, 7: {"q": "c"}})
    return ExportCell("demo", "run-1", "tiny", "mc", step, "ab" * 32, "c" * 64, "d" * 64, "0.4.13", "0.1.0",
                      1_780_000_000.25, {"next_line": task})


def _written(out: Path, write, cell: ExportCell, *args) -> list[Path]:
    """``write``'s files of ``cell``, staged and put in place in ``out`` (as evald export does)."""
    with open_target(out) as target:
        paths = write(cell, target, *args)
        assert sorted(target.commit()) == sorted(paths)
    return paths


def test_lm_eval_files_have_its_keys_and_its_task_hash(tmp_path):
    cell = _cell()
    results_path, samples_path = _written(tmp_path, lm_eval_files.write, cell)
    assert results_path.name == "results_2026-05-28T20-26-40.250000.json"
    assert samples_path.name == "samples_next_line_2026-05-28T20-26-40.250000.jsonl"
    results = json.loads(results_path.read_text())
    assert results["results"]["next_line"]["acc,none"] == 2 / 3 and "acc,strict" in results["results"]["next_line"]
    ordered = sorted(cell.tasks["next_line"].samples, key=lambda s: s["doc_id"])   # lm-eval: document order
    expected = _hash("".join(s["doc_hash"] + s["prompt_hash"] + s["target_hash"] for s in ordered))
    assert results["task_hashes"] == {"next_line": expected}
    assert results["n-samples"] == {"next_line": {"original": 12, "effective": 3}}
    assert results["evald"]["step"] == 300 and results["evald"]["weights_sha256"] == "ab" * 32
    rows = [json.loads(line) for line in samples_path.read_text().splitlines()]
    assert [r["doc_id"] for r in rows] == [1, 4, 7] and rows[0]["doc"] == {"q": "a"} and rows[0]["acc"] == 0.0
    from lm_eval.utils import make_table

    assert "next_line" in make_table(results)
    assert lm_eval_key("acc") == "acc,none" and lm_eval_key("acc@strict") == "acc,strict"


def test_a_cell_without_lm_evals_hashes_has_no_task_hash(tmp_path):
    results_path = _written(tmp_path, lm_eval_files.write, _cell(with_hashes=False))[0]
    assert json.loads(results_path.read_text())["task_hashes"] == {}


def test_every_eval_ever_files_pass_its_published_schemas(tmp_path):
    record_path, samples_path = _written(tmp_path, every_eval_ever.write, _cell(), "acme")
    record = json.loads(record_path.read_text())
    schema = jsonschema.Draft7Validator(json.loads((EEE / "eval.schema.json").read_text()))
    assert [e.message for e in schema.iter_errors(record)] == []
    instance = jsonschema.Draft7Validator(json.loads((EEE / "instance_level_eval.schema.json").read_text()))
    rows = [json.loads(line) for line in samples_path.read_text().splitlines()]
    assert len(rows) == 3 and [e.message for r in rows for e in instance.iter_errors(r)] == []   # acc only: ll is no 0/1
    assert record["detailed_evaluation_results"]["total_rows"] == 3
    assert (tmp_path / "every-eval-ever" / record["detailed_evaluation_results"]["file_path"]) == samples_path
    assert record["model_info"]["additional_details"]["weights_sha256"] == "ab" * 32
    assert _written(tmp_path, every_eval_ever.write, _cell(), "acme")[0] == record_path   # the same name again
    broken = dict(record, source_metadata={"source_type": "evaluation_run"})
    assert list(schema.iter_errors(broken))                                               # the schema does refuse
    assert stable_uuid4("a") == stable_uuid4("a") != stable_uuid4("b")


def test_hf_eval_results_name_the_step_and_digest(tmp_path):
    (path,) = _written(tmp_path, hf_eval_results.write, _cell(step=40))
    assert path.relative_to(tmp_path).as_posix() == "hf/step_40/.eval_results/mc_next_line.yaml"
    entries = yaml.safe_load(path.read_text())
    assert [e["value"] for e in entries] == [2 / 3, 0.5, -1.2]
    assert all("step 40" in e["notes"] and "ab" * 32 in e["notes"] for e in entries)
    assert entries[0]["dataset"] == {"id": "next_line", "task_id": "next_line"} and entries[0]["date"] == "2026-05-28"
