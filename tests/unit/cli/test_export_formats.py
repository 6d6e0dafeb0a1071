"""``evald export`` of real lm-eval tasks (the demo's ``stdlib_next_line`` and its rolling ``bpb_*``
tasks), in process, read back against each format's own rules: lm-eval's table, Every Eval Ever 0.3.0's
schemas and repository rules (tests/every_eval_ever_check.py), Hugging Face's entries as huggingface_hub
parses them. The demo's word perplexity (4.1e10 at step 400) is in the lm-eval and Every Eval Ever files,
never a Hugging Face value."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from evald.cli.main import main
from tests.every_eval_ever_check import problems
from tests.export_runs import build_run, include_dir, suite_identity

pytest.importorskip("lm_eval")

BPB_TASKS = ("bpb_email", "bpb_http")
WORD_PERPLEXITY = 4.1e10


@pytest.fixture(scope="module")
def include(tmp_path_factory) -> str:
    return include_dir(tmp_path_factory.mktemp("bench"))


def _bpb_run(tmp_path: Path, include: str) -> tuple[Path, Path]:
    """Suite ``bpb`` at steps 300 and 400: per document lm-eval's (log-likelihood, words or bytes) pairs."""
    documents = [{"doc_id": 0, "target": "", "resps": [[-900.5]],
                  "metrics": {"word_perplexity": [-900.5, 40], "byte_perplexity": [-900.5, 320],
                              "bits_per_byte": [-900.5, 320]}}]
    return build_run(tmp_path, include, suite_identity(include, "bpb", BPB_TASKS), steps=(300, 400),
                     samples=documents,
                     aggregates={"word_perplexity": WORD_PERPLEXITY, "byte_perplexity": 2.61, "bits_per_byte": 1.384})


def _export(run_dir: Path, config: Path, out: Path, capsys) -> None:
    code = main(["export", "--run-dir", str(run_dir), "--config", str(config), "--out", str(out)])
    said = capsys.readouterr()
    assert code == 0, said.out + said.err


def test_a_rolling_log_likelihood_suite_exports_valid_files_and_no_perplexity_headline(tmp_path, include, capsys):
    from huggingface_hub import eval_result_entries_to_yaml, parse_eval_result_entries
    from lm_eval.utils import make_table

    run_dir, config = _bpb_run(tmp_path, include)
    out = tmp_path / "out"
    _export(run_dir, config, out, capsys)
    assert problems(out / "every-eval-ever") == []
    records = [json.loads(p.read_text()) for p in sorted((out / "every-eval-ever").rglob("*.json"))]
    assert len(records) == 2 and not list((out / "every-eval-ever").rglob("*.jsonl"))   # no 0/1 answer: no rows
    for record in records:
        step = record["model_info"]["additional_details"]["step"]
        assert record["model_info"]["additional_details"]["weights_sha256"] == f"{int(step):02d}" * 32
        word = [r for r in record["evaluation_results"] if r["metric_config"]["metric_name"] == "word_perplexity"]
        assert [r["score_details"]["score"] for r in word] == [WORD_PERPLEXITY] * 2      # kept, and described
        assert all(r["metric_config"]["lower_is_better"] and r["metric_config"]["additional_details"]["primary"]
                   == "false" for r in word)
    for step in (300, 400):
        (results,) = (out / "lm-eval" / "bpb" / f"step_{step}").rglob("results_*.json")
        assert "bpb_email" in make_table(json.loads(results.read_text()))
        files = sorted((out / "hf" / f"step_{step}" / ".eval_results").glob("*.yaml"))
        entries = [e for f in files for e in yaml.safe_load(f.read_text())]
        assert eval_result_entries_to_yaml(parse_eval_result_entries(entries)) == entries
        assert [(e["dataset"]["id"], e["dataset"]["task_id"], e["value"]) for e in entries] == \
            [(t, t, 1.384) for t in BPB_TASKS]                                          # bits per byte, per task
        assert all(f"checkpoint step {step}, weights_sha256 {step:02d}" in e["notes"] for e in entries)


def test_a_multiple_choice_suite_exports_valid_files(tmp_path, include, capsys):
    from huggingface_hub import parse_eval_result_entries

    run_dir, config = build_run(tmp_path, include, suite_identity(include), steps=(30, 40))
    out = tmp_path / "out"
    _export(run_dir, config, out, capsys)
    assert problems(out / "every-eval-ever") == []
    assert len(list((out / "every-eval-ever").rglob("*_samples.jsonl"))) == 2
    for step in (30, 40):
        (path,) = (out / "hf" / f"step_{step}" / ".eval_results").glob("*.yaml")
        (entry,) = parse_eval_result_entries(yaml.safe_load(path.read_text()))
        assert (entry.dataset_id, entry.task_id, entry.value) == ("stdlib_next_line", "stdlib_next_line", 0.5)
        assert entry.notes.startswith("lm-eval acc,none (higher is better) ± 0.25 (standard error), 4 of 12")
