"""Issue 37, item 9: the sample task of docs/benchmarks.md ("Your own lm-eval task") loads without a warning.

Its metric_list named metrics without ``aggregation`` and ``higher_is_better``, and lm-eval warned four
times ("metric acc is defined, but aggregation is not. using default aggregation=mean", ...) when a user
copied it. The page's YAML and TOML are used as they stand (only the data file's absolute path is this
test's): the TOML's relative include_path is read beside it, and evald's own task loader loads the task
while every lm-eval log record and Python warning is collected.
"""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path

from evald.config import resolve, toml_layer
from evald.pipeline.suites.task_files import task_manager
from tests.doc_snippets import blocks

PAGE = Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md"
YAML_NAME = "# mytasks/my_mc.yaml"


def _snippets() -> tuple[str, str]:
    found = blocks(PAGE.read_text())
    yaml = next(code for language, code in found if language == "yaml" and code.startswith(YAML_NAME))
    toml = next(code for language, code in found if language == "toml" and "[suites.mine]" in code)
    return yaml, toml


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(f"{record.name}: {record.getMessage()}")


def test_the_docs_sample_task_loads_without_a_warning(tmp_path, monkeypatch):
    yaml, toml = _snippets()
    data = tmp_path / "my_mc.jsonl"
    data.write_text("".join(json.dumps({"question": q, "choices": c, "answer": a}) + "\n" for q, c, a in
                            [("2 + 2 =", ["3", "4", "5"], 1), ("The sky is", ["green", "blue"], 1)]))
    docs_data = yaml.split("test: ", 1)[1].split()[0]
    assert docs_data.startswith("/"), "the page's data file is absolute (lm-eval reads it against the cwd)"
    conf = tmp_path / "conf"
    (conf / "mytasks").mkdir(parents=True)
    (conf / "mytasks" / "my_mc.yaml").write_text(yaml.replace(docs_data, str(data)))
    (conf / "evald.toml").write_text(toml)
    monkeypatch.chdir(tmp_path)        # not the TOML's directory: include_path is read beside the TOML
    suite = resolve([toml_layer(conf / "evald.toml")]).config.suites["mine"]
    assert suite.include_path == (str(conf / "mytasks"),)

    collected = _Collect()
    lm_eval_logger = logging.getLogger("lm_eval")
    lm_eval_logger.addHandler(collected)
    try:
        with warnings.catch_warnings(record=True) as python_warnings:
            warnings.simplefilter("always")
            loaded = task_manager(suite.include_path, suite.tasks).load(list(suite.tasks))
    finally:
        lm_eval_logger.removeHandler(collected)
    task = loaded["tasks"]["my_mc"]
    assert len(list(task.test_docs())) == 2 and task.config.output_type == "multiple_choice"
    assert collected.messages == [], collected.messages
    assert [str(w.message) for w in python_warnings if "lm_eval" in (w.filename or "")] == []
