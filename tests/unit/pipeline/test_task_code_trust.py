"""Task YAML is code (issue 27, High 1): lm-eval's ``!function module.fn`` imports ``module.py`` beside the
YAML as evald's user when a suite is built. The trust rule of factories and RUN.json covers a suite's
``include_path`` directories, the YAML in them (and what they ``include``) and the modules ``!function``
names: another uid's file, or a directory others may write, is refused before lm-eval reads anything, and the
module never runs (it would write a marker file)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from evald.pipeline.suites.task_files import task_manager
from evald.pipeline.suites.task_files import UntrustedTaskCode, check_task_files

OTHER_UID = 4242


@pytest.fixture(autouse=True)
def _offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))


def _tasks(root: Path, name: str, *, separate_base: bool = False) -> tuple[Path, Path]:
    """A task whose ``process_docs`` is ``!function helpers.keep``; importing helpers.py writes a marker."""
    tasks = root / "tasks"
    tasks.mkdir(mode=0o755)
    os.chmod(tasks, 0o755)
    data = root / "docs.jsonl"
    data.write_text("".join(json.dumps({"q": f"q{i}?", "choices": ["x", "y"], "label": i % 2}) + "\n"
                            for i in range(4)))
    marker = root / f"{name}.ran"
    (tasks / "helpers.py").write_text(f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n"
                                      "def keep(dataset):\n    return dataset\n")
    body = (f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\ntest_split: test\n"
            "process_docs: !function helpers.keep\noutput_type: multiple_choice\ndoc_to_text: '{{q}}'\n"
            "doc_to_choice: '{{choices}}'\ndoc_to_target: '{{label}}'\nmetric_list:\n  - metric: acc\n")
    if separate_base:   # the task includes a base YAML that holds the !function
        (tasks / "_base_yaml").write_text(body)
        (tasks / f"{name}.yaml").write_text(f"include: _base_yaml\ntask: {name}\n")
    else:
        (tasks / f"{name}.yaml").write_text(f"task: {name}\n" + body)
    for path in tasks.iterdir():
        os.chmod(path, 0o644)
    return tasks, marker


def _load(tasks: Path, name: str):
    return task_manager((str(tasks),), (name,)).load([name])["tasks"]


def test_a_trusted_task_directory_loads_and_runs_its_module(tmp_path):
    """The control: the same files, evald's own and closed, are loaded and their module runs."""
    tasks, marker = _tasks(tmp_path, "trusted_task")
    assert "trusted_task" in _load(tasks, "trusted_task")
    assert marker.exists()


@pytest.mark.parametrize("plant", ["world_writable_dir", "group_writable_dir", "foreign_yaml", "foreign_module",
                                   "writable_module", "foreign_include"])
def test_untrusted_task_code_is_refused_before_lm_eval_runs_it(tmp_path, plant):
    name = f"planted_{plant}"
    tasks, marker = _tasks(tmp_path, name, separate_base=plant == "foreign_include")
    culprit = {"world_writable_dir": tasks, "group_writable_dir": tasks, "foreign_yaml": tasks / f"{name}.yaml",
               "foreign_module": tasks / "helpers.py", "writable_module": tasks / "helpers.py",
               "foreign_include": tasks / "_base_yaml"}[plant]
    if plant == "world_writable_dir":
        os.chmod(tasks, 0o777)
    elif plant == "group_writable_dir":
        os.chmod(tasks, 0o775)
    elif plant == "writable_module":
        os.chmod(culprit, 0o666)
    else:
        os.chown(culprit, OTHER_UID, OTHER_UID)
    with pytest.raises(UntrustedTaskCode) as refused:
        _load(tasks, name)
    message = str(refused.value)
    assert str(culprit) in message and "docs/security.md" in message
    assert ("uid 4242" in message) if plant.startswith("foreign") else ("can write" in message)
    assert not marker.exists(), "the planted module ran"


def test_a_world_writable_directory_above_without_the_sticky_bit_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    tasks, marker = _tasks(shared, "under_open_parent")
    os.chmod(shared, 0o777)
    with pytest.raises(UntrustedTaskCode, match=str(shared)):
        _load(tasks, "under_open_parent")
    assert not marker.exists()
    os.chmod(shared, 0o777 | stat.S_ISVTX)   # /tmp-like: others cannot rename evald's directory away
    check_task_files([str(tasks)])


def test_a_module_outside_the_include_path_named_by_an_absolute_include_is_checked(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    base, marker = _tasks(outside, "base_elsewhere", separate_base=True)
    tasks = tmp_path / "mine"
    tasks.mkdir()
    (tasks / "mine.yaml").write_text(f"include: {base / '_base_yaml'}\ntask: mine\n")
    os.chown(base / "helpers.py", OTHER_UID, OTHER_UID)
    with pytest.raises(UntrustedTaskCode, match=str(base / "helpers.py")):
        check_task_files([str(tasks)])
    assert not marker.exists()


def test_the_suite_runner_refuses_before_lm_eval_reads_the_tasks(tmp_path):
    """Where evald builds a suite (the daemon logs "cannot build suite NAME: ..." and runs the others)."""
    from evald.config.options import SuiteOptions
    from evald.pipeline.suites.runner import SuiteRunner
    from evald.pipeline.suites.tokenizer import ByteTokenizer

    tasks, marker = _tasks(tmp_path, "built_by_the_runner")
    os.chown(tasks / "helpers.py", OTHER_UID, OTHER_UID)
    options = SuiteOptions(tasks=("built_by_the_runner",), include_path=(str(tasks),))
    with pytest.raises(UntrustedTaskCode, match="helpers.py"):
        SuiteRunner("mc", options, network=None, tokenizer=ByteTokenizer())
    assert not marker.exists()
