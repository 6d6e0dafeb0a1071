"""`evald export`'s writers on hand-made cells: lm-eval's files and its task hash; Every Eval Ever 0.3.0
(its published schemas, vendored in tests/data/every_eval_ever, and its validator's repository rules:
tests/every_eval_ever_check.py); Hugging Face .eval_results entries as huggingface_hub reads them. Each
carries the checkpoint's step and snapshot digest; no perplexity is published as a headline."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from evald.sinks import every_eval_ever, hf_eval_results, lm_eval_files
from evald.sinks.export_cells import ExportCell, ExportTask, lm_eval_key, primary_metric, stable_uuid4
from evald.sinks.export_target import open_target
from tests.every_eval_ever_check import problems, record_problems, schema_version

DIGEST = "ab" * 32
WORD_PERPLEXITY = 4.1e10          # the demo's bpb suite at step 400 (issue 37)


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
    return _of("mc", step, {"next_line": task})


def _of(suite: str, step: int, tasks: dict[str, ExportTask]) -> ExportCell:
    return ExportCell("demo", "run-1", "tiny", suite, step, DIGEST, "c" * 64, "d" * 64, "0.4.13", "0.1.0",
                      1_780_000_000.25, tasks)


def _metric_list(*names: str, higher: bool = True, aggregation: str = "mean") -> list[dict]:
    return [{"metric": n, "aggregation": aggregation, "higher_is_better": higher} for n in names]


def _bpb_cell(step: int = 400) -> ExportCell:
    """The demo's bpb suite: rolling log-likelihood tasks, whose per-document values are no 0/1 answers."""
    samples = [{"doc_id": i, "target": "text", "resps": [[-300.0 - i]],
                "metrics": {m: [-300.0 - i, 320] for m in ("word_perplexity", "byte_perplexity", "bits_per_byte")}}
               for i in range(2)]
    config = {"task": "bpb_email", "dataset_path": "json", "output_type": "loglikelihood_rolling",
              "metric_list": [*_metric_list("word_perplexity", "byte_perplexity", higher=False,
                                            aggregation="weighted_perplexity"),
                              *_metric_list("bits_per_byte", higher=False, aggregation="bits_per_byte")]}
    task = ExportTask("bpb_email", {"word_perplexity": WORD_PERPLEXITY, "byte_perplexity": 2.61, "bits_per_byte": 1.384},
                      samples, config, 1.0, 0, {"word_perplexity": False, "byte_perplexity": False,
                                                "bits_per_byte": False}, 6)
    only = ExportTask("ppl_only", {"perplexity": 3.5e9}, [dict(s, metrics={"perplexity": -2.3}) for s in samples],
                      {"task": "ppl_only", "metric_list": _metric_list("perplexity", higher=False,
                                                                       aggregation="perplexity")},
                      1.0, 0, {"perplexity": False}, 2)
    return _of("bpb", step, {"bpb_email": task, "ppl_only": only})


def _hub_cell() -> ExportCell:
    """Hub datasets: two tasks of one dataset (ARC's two configs), and a generative task with two filters."""
    def mc(name: str, acc: float) -> ExportTask:
        samples = [{"doc_id": i, "target": "0", "resps": [], "metrics": {"acc": float(i % 2), "acc_norm": 1.0}}
                   for i in range(4)]
        return ExportTask(name, {"acc": acc, "acc_stderr": 0.2, "acc_norm": 0.75, "acc_norm_stderr": 0.2}, samples,
                          {"task": name, "dataset_path": "allenai/ai2_arc", "dataset_name": name.upper(),
                           "metric_list": _metric_list("acc", "acc_norm")}, 1.0, 25,
                          {"acc": True, "acc_norm": True}, 2376)
    gen = ExportTask("gsm8k", {"exact_match@strict-match": 0.1, "exact_match_stderr@strict-match": 0.05,
                               "exact_match@flexible-extract": 0.2},
                     [{"doc_id": 0, "target": "4", "resps": [["4"]], "metrics": {}}],
                     {"task": "gsm8k", "dataset_path": "openai/gsm8k", "dataset_kwargs": {"revision": "e53f048"},
                      "metric_list": _metric_list("exact_match"),
                      "filter_list": [{"name": "strict-match", "filter": []}, {"name": "flexible-extract", "filter": []}]},
                     3.0, 5, {"exact_match": True}, 1319)
    return _of("hub", 120, {"arc_easy": mc("arc_easy", 0.5), "arc_challenge": mc("arc_challenge", 0.25), "gsm8k": gen})


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


def _eee(tmp_path: Path, cell: ExportCell) -> tuple[dict, list[Path]]:
    paths = _written(tmp_path, every_eval_ever.write, cell, "acme")
    return json.loads(paths[0].read_text()), paths


def test_every_eval_ever_files_are_a_valid_0_3_0_contribution(tmp_path):
    record, (record_path, samples_path) = _eee(tmp_path, _cell())
    assert schema_version() == "0.3.0" and record["schema_version"] == "0.3.0"
    assert problems(tmp_path / "every-eval-ever") == []
    rows = [json.loads(line) for line in samples_path.read_text().splitlines()]
    assert len(rows) == 3 and {r["schema_version"] for r in rows} == {"0.3.0"}        # acc only: ll is no 0/1
    assert record["detailed_evaluation_results"]["total_rows"] == 3
    assert (tmp_path / "every-eval-ever" / record["detailed_evaluation_results"]["file_path"]) == samples_path
    assert record["eval_library"]["name"] == "lm_eval" and record["eval_library"]["version"] == "0.4.13"
    details = record["model_info"]["additional_details"]
    assert (details["deployment_type"], details["model_availability"]) == ("self_deployed", "unknown")
    assert _written(tmp_path, every_eval_ever.write, _cell(), "acme")[0] == record_path   # the same name again
    assert stable_uuid4("a") == stable_uuid4("a") != stable_uuid4("b")


def test_a_cell_of_rolling_log_likelihood_tasks_is_a_valid_0_3_0_contribution(tmp_path):
    """No per-document 0/1 answer: no samples file (0.3.0 refuses an empty one), the aggregates all there."""
    record, paths = _eee(tmp_path, _bpb_cell())
    assert problems(tmp_path / "every-eval-ever") == []
    assert len(paths) == 1 and "detailed_evaluation_results" not in record
    results = {r["evaluation_name"] + "/" + r["metric_config"]["metric_name"]: r for r in record["evaluation_results"]}
    word = results["bpb_email/word_perplexity"]
    assert word["score_details"]["score"] == WORD_PERPLEXITY and word["metric_config"]["lower_is_better"] is True
    assert (word["metric_config"]["min_score"], word["metric_config"]["max_score"]) == (1, "Infinity")
    assert word["metric_config"]["additional_details"]["primary"] == "false"
    assert results["bpb_email/bits_per_byte"]["metric_config"]["additional_details"]["primary"] == "true"
    assert results["ppl_only/perplexity"]["metric_config"]["metric_id"] == "perplexity"


@pytest.mark.parametrize("cell", [_cell, _bpb_cell, _hub_cell])
def test_every_eval_evers_results_name_their_metric_direction_and_range(tmp_path, cell):
    record, _ = _eee(tmp_path, cell())
    assert problems(tmp_path / "every-eval-ever") == []
    for result in record["evaluation_results"]:
        config = result["metric_config"]
        name = config["metric_name"]
        assert config["metric_id"] in ("accuracy", "exact-match", "perplexity") or config["metric_id"] == \
            f"lm-evaluation-harness.{name}"
        if name in ("acc", "acc_norm", "exact_match"):
            assert (config["score_type"], config["min_score"], config["max_score"]) == ("continuous", 0, 1)
            assert config["lower_is_better"] is False
    ids = [r["evaluation_result_id"] for r in record["evaluation_results"]]
    assert len(ids) == len(set(ids))


def test_the_0_3_0_check_refuses_what_its_validator_refuses(tmp_path):
    """The checks can fail: evald's 0.2 record (its version), an empty companion, a wrong row count or
    checksum, a model without the 0.3.0 details, a continuous metric without bounds."""
    record, (record_path, samples_path) = _eee(tmp_path, _cell())
    root = tmp_path / "every-eval-ever"
    assert any("schema_version '0.2.3'" in p for p in record_problems(dict(record, schema_version="0.2.3")))
    model = dict(record["model_info"], additional_details={"step": "300"})
    assert any("deployment_type" in p for p in record_problems(dict(record, model_info=model)))
    unbounded = json.loads(json.dumps(record))
    unbounded["evaluation_results"][0]["metric_config"].pop("max_score")
    assert record_problems(unbounded)
    samples_path.write_text(samples_path.read_text().splitlines(keepends=True)[0])
    assert {"total_rows 3, the file has 1", "checksum is not"} <= {w for p in problems(root)
                                                                      for w in ("total_rows 3, the file has 1",
                                                                                "checksum is not") if w in p}
    samples_path.write_text("")
    assert any("no row" in p for p in problems(root))
    samples_path.unlink()
    assert any("does not exist" in p for p in problems(root))


def test_every_eval_ever_carries_the_step_and_digest(tmp_path):
    record, (_, samples_path) = _eee(tmp_path, _cell(step=300))
    assert record["model_info"]["id"] == "tiny@step-300"
    for details in (record["model_info"]["additional_details"], record["source_metadata"]["additional_details"],
                    *(json.loads(line)["metadata"] for line in samples_path.read_text().splitlines())):
        assert (details["step"], details["weights_sha256"]) == ("300", DIGEST)


def _hf_entries(tmp_path: Path, cell: ExportCell) -> dict[str, list[dict]]:
    return {p.name: yaml.safe_load(p.read_text()) for p in _written(tmp_path, hf_eval_results.write, cell)}


@pytest.mark.parametrize("cell", [_cell, _bpb_cell, _hub_cell])
def test_hf_entries_are_hugging_faces_one_per_task_with_dataset_and_task_ids(tmp_path, cell):
    """huggingface_hub reads every entry back unchanged (dataset.id and task_id required, no field of
    its own), and no two entries share a dataset and task: a leaderboard takes one value each."""
    from huggingface_hub import eval_result_entries_to_yaml, parse_eval_result_entries

    files = _hf_entries(tmp_path, cell())
    entries = [e for found in files.values() for e in found]
    assert all(len(found) == 1 for found in files.values())
    assert eval_result_entries_to_yaml(parse_eval_result_entries(entries)) == entries
    pairs = [(e["dataset"]["id"], e["dataset"]["task_id"]) for e in entries]
    assert len(pairs) == len(set(pairs)) and all(all(pair) for pair in pairs)


def test_hf_entries_publish_each_tasks_headline_metric_named_with_its_direction(tmp_path):
    files = _hf_entries(tmp_path / "hub", _hub_cell())
    (arc_easy,), (gsm8k,) = files["hub_arc_easy.yaml"], files["hub_gsm8k.yaml"]
    assert arc_easy["dataset"] == {"id": "allenai/ai2_arc", "task_id": "arc_easy"} and arc_easy["value"] == 0.5
    assert arc_easy["notes"].startswith("lm-eval acc,none (higher is better) ± 0.2 (standard error), 4 of 2376")
    assert files["hub_arc_challenge.yaml"][0]["dataset"] == {"id": "allenai/ai2_arc", "task_id": "arc_challenge"}
    assert gsm8k["dataset"] == {"id": "openai/gsm8k", "task_id": "gsm8k", "revision": "e53f048"}
    assert gsm8k["value"] == 0.1 and "exact_match,strict-match (higher is better)" in gsm8k["notes"]
    ((local,),) = _hf_entries(tmp_path / "local", _cell()).values()     # local data: the task's name, to replace
    assert local["dataset"] == {"id": "next_line", "task_id": "next_line"} and local["value"] == 2 / 3
    assert local["date"] == "2026-05-28T20:26:40Z"


def test_hf_entries_publish_no_perplexity(tmp_path):
    """A rolling log-likelihood task publishes its bits per byte, not the 4.1e10 word perplexity; a task with
    only perplexities publishes nothing."""
    files = _hf_entries(tmp_path, _bpb_cell())
    assert list(files) == ["bpb_bpb_email.yaml"]
    (entry,) = files["bpb_bpb_email.yaml"]
    assert entry["value"] == 1.384 and "bits_per_byte,none (lower is better)" in entry["notes"]
    assert primary_metric(_bpb_cell().tasks["ppl_only"]) is None


def test_hf_entries_name_the_step_and_digest(tmp_path):
    (path,) = _written(tmp_path, hf_eval_results.write, _cell(step=40))
    assert path.relative_to(tmp_path).as_posix() == "hf/step_40/.eval_results/mc_next_line.yaml"
    (entry,) = yaml.safe_load(path.read_text())
    assert f"checkpoint step 40, weights_sha256 {DIGEST}" in entry["notes"]


def _steps_and_digests(path: Path) -> set[tuple[int, str]] | None:
    """The (step, weights_sha256) a written file names, read where its format keeps them; None for
    lm-eval's samples files (its results file names the checkpoint)."""
    if path.name.startswith("samples_"):
        return None
    if path.name.startswith("results_"):
        found = json.loads(path.read_text())["evald"]
        return {(found["step"], found["weights_sha256"])}
    if path.suffix == ".json":
        found = json.loads(path.read_text())["model_info"]["additional_details"]
        return {(int(found["step"]), found["weights_sha256"])}
    if path.suffix == ".jsonl":
        rows = [json.loads(line)["metadata"] for line in path.read_text().splitlines()]
        return {(int(r["step"]), r["weights_sha256"]) for r in rows}
    notes = [e["notes"] for e in yaml.safe_load(path.read_text())]
    return {(int(m[1]), m[2]) for m in (re.search(r"checkpoint step (\d+), weights_sha256 (\w+)", n) for n in notes)}


@pytest.mark.parametrize("write", [lm_eval_files.write, every_eval_ever.write, hf_eval_results.write])
def test_each_format_carries_the_step_and_digest_of_every_cell(tmp_path, write):
    for cell in (_cell(step=300), _bpb_cell(step=400), _hub_cell()):
        found = [_steps_and_digests(p) for p in _written(tmp_path / cell.suite, write, cell)]
        assert found and all(f == {(cell.step, DIGEST)} for f in found if f is not None)
