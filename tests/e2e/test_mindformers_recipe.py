"""docs/mindformers.md, followed on a CPU with MindFormers 2.0.0 (issue 18, item 9).

Everything runs in the environment scripts/setup_mindformers.sh makes (evald and MindFormers in one
venv, as a MindFormers user has them; scripts/test.sh runs it), from a directory holding the page's
own files, written out as the page shows them:

* section 2: the training script ``train.py`` in MindFormers' ``Trainer`` beside the page's evald
  command: every checkpoint of the run is evaluated once, one TensorBoard point per step, and
  MindFormers' INFO lines stay out of evald's log;
* section 1: the page's evald command on the run's own MindFormers files evaluates every one with the
  losses of section 2, which equal an in-process evaluation of those files (tests/mindformers_reference.py);
* a model factory given another configuration (1 layer) fails every step, naming what the file holds
  that the model lacks, instead of giving a plausible number;
* the plain install the page shows fails on this index, for the reason it gives (no hyper-parallel).

The one departure from the page: section 1's ``--idle-exit-s 60`` becomes 5, since that command is
started after training ended. ``hyper_parallel`` is an import stand-in (tests/mindformers_stand_in),
because the index has no hyper-parallel; MindFormers' Graph-mode Trainer never calls into it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.doc_snippets import blocks, evald_commands, run_python_file, write_python_files
from tests.faults import ledger_files, ledger_rows
from tests.harness import REPO, run_dir, scalar_points

PAGE = REPO / "docs" / "mindformers.md"
MF_VENV = REPO / ".venv-mindformers"
MF_PYTHON = MF_VENV / "bin" / "python"
STAND_IN = REPO / "tests" / "mindformers_stand_in"
STEPS = [10, 20, 30, 40, 50]  # train.py: 50 steps, a snapshot and a MindFormers checkpoint every 10
# What the right model's loss may differ by between evald and the reference: both run the same Graph-mode
# network in float32 on CPU; the sums differ in order (evald sums per sample in float64 too).
LOSS_TOLERANCE = 2e-5


@dataclass
class Recipe:
    root: Path         # the user's directory: mypkg/, train.py, and what they write
    logs: Path         # the processes' output, outside the user's directory
    env: dict[str, str]
    page: str
    llama: dict


def _mf_env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EVALD_", "LOG_MF"))}
    env.update({"GLOG_v": "3", "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(STAND_IN),
                "EVALD_SOCKET_DIR": str(tmp / "sockets")})  # this test's own, not the default /tmp/evald-UID
    return env


def _run(recipe: Recipe, args: list[str], name: str, cwd: Path, cpu: int, timeout: float
         ) -> subprocess.CompletedProcess:
    with open(recipe.logs / f"{name}.log", "wb") as log:
        return subprocess.run(["taskset", "-c", str(cpu), str(MF_PYTHON), *args], cwd=cwd, env=recipe.env,
                              stdout=log, stderr=subprocess.STDOUT, timeout=timeout)


def _log(recipe: Recipe, name: str) -> str:
    return (recipe.logs / f"{name}.log").read_text(errors="replace")


def _section_command(page: str, *, section: int) -> list[str]:
    """The page's evald command of section 1 (on MindFormers' files: ``--ckpt-dir`` and the factories)
    or of section 2 (beside a trainer with EvaldCallback: no ``--ckpt-dir``)."""
    [command] = [c for c in evald_commands(page) if ("--ckpt-dir" in c) == (section == 1)]
    return command


@pytest.fixture(scope="module")
def recipe(tmp_path_factory) -> Recipe:
    if not MF_PYTHON.exists():
        pytest.fail(f"{MF_VENV} is missing: run scripts/setup_mindformers.sh (scripts/test.sh runs it)")
    tmp = tmp_path_factory.mktemp("mindformers-recipe")
    root, logs = tmp / "user", tmp / "logs"
    root.mkdir()
    logs.mkdir()
    page = PAGE.read_text()
    write_python_files(page, root)
    recipe = Recipe(root, logs, _mf_env(tmp), page, run_python_file(page, "mypkg/llama.py")["LLAMA"])

    # Section 2: evald first (the page: "beside it, from the same directory"), then the training script.
    evald_args = _section_command(page, section=2)
    with open(logs / "evald-section2.log", "wb") as log:
        evald = subprocess.Popen(["taskset", "-c", "1", str(MF_PYTHON), "-m", "evald", *evald_args], cwd=root,
                                 env=recipe.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        train = _run(recipe, ["train.py"], "train", root, cpu=0, timeout=900)
        assert train.returncode == 0, _log(recipe, "train")[-4000:]
        assert evald.wait(timeout=300) == 0, _log(recipe, "evald-section2")[-4000:]
    finally:
        if evald.poll() is None:
            evald.kill()
            evald.wait()
    return recipe


def test_section_2_evaluates_every_checkpoint_of_the_run_once(recipe):
    output = recipe.root / "output"
    rows = ledger_rows(output)
    assert [(r["step"], r["state"]) for r in rows] == [(s, "evaluated") for s in STEPS], rows
    assert [p[0] for p in scalar_points(run_dir(output), "eval/loss")] == STEPS  # one point per step
    # MindFormers' own files of the same steps are recorded as duplicates, not evaluated again
    mindformers_files = {name: f for name, f in ledger_files(output).items() if name.startswith("checkpoint")}
    assert len(mindformers_files) == 2 * len(STEPS)
    assert {f["status"] for f in mindformers_files.values()} == {"duplicate"}
    summary = json.loads((run_dir(output) / "summary.json").read_text())
    assert (summary["final_step"], summary["training_end_reason"], summary["checkpoints"]) == (
        50, "completed", {"evaluated": 5})
    # evald wrote nothing into the trainer's output; its state is beside it, by default
    assert sorted(p.name for p in recipe.root.iterdir()) == ["mypkg", "output", "tensorboard", "train.py"]


def test_mindformers_info_lines_stay_out_of_evalds_log(recipe):
    evald_log = _log(recipe, "evald-section2")
    assert "evaluation network ready" in evald_log
    framework_lines = [line for line in evald_log.splitlines() if line.split(" - ")[0].endswith("mindformers")
                       or " - mindformers" in line]
    assert not [line for line in framework_lines if " - INFO - " in line], framework_lines[:5]
    assert "MindFormers' INFO lines go to its own log files" in evald_log
    # ... and they are kept in MindFormers' own files, which evald points outside the trainer's tree: its
    # private socket directory here, since no --ckpt-dir is given (cli.main.keep_framework_logs_out_of_cwd)
    [info_log] = re.findall(r"its own log files \((\S+/info\.log)", evald_log)
    assert Path(info_log).is_relative_to(recipe.env["EVALD_SOCKET_DIR"])
    assert "MoE config is None" in Path(info_log).read_text()


@pytest.fixture(scope="module")
def section1(recipe) -> tuple[Path, list[str]]:
    """The run's MindFormers files alone, in a directory of their own, with section 1's command."""
    root = recipe.root.parent / "section1"
    shutil.copytree(recipe.root / "mypkg", root / "mypkg")
    for kind in ("checkpoint", "checkpoint_network"):
        shutil.copytree(recipe.root / "output" / kind, root / "output" / kind)
    command = _section_command(recipe.page, section=1)
    assert command[command.index("--idle-exit-s") + 1] == "60"
    command[command.index("--idle-exit-s") + 1] = "5"  # started after training ended: no need to wait a minute
    return root, command


def test_section_1_gives_every_mindformers_file_the_loss_of_an_in_process_evaluation(recipe, section1):
    root, command = section1
    done = _run(recipe, ["-m", "evald", *command], "evald-section1", root, cpu=1, timeout=600)
    assert done.returncode == 0, _log(recipe, "evald-section1")[-4000:]
    output = root / "output"
    rows = ledger_rows(output)
    assert [(r["step"], r["state"]) for r in rows] == [(s, "evaluated") for s in STEPS], rows
    assert all(r["key"].startswith("checkpoint_network/rank_0/") for r in rows)  # the weights-only files
    section1_loss = {step: value for step, _, value in scalar_points(run_dir(output), "eval/loss")}
    section2_loss = {step: value for step, _, value in scalar_points(run_dir(recipe.root / "output"), "eval/loss")}
    assert section1_loss.keys() == section2_loss.keys() == set(STEPS)
    for step in STEPS:  # the trainer's snapshot and MindFormers' file of one step hold the same weights
        assert abs(section1_loss[step] - section2_loss[step]) <= 1e-6, (step, section1_loss, section2_loss)

    (recipe.logs / "llama.json").write_text(json.dumps(recipe.llama))
    files = [str(output / rows[0]["key"]), str(output / rows[-1]["key"])]  # the first and the last step
    reference = _run(recipe, [str(REPO / "tests" / "mindformers_reference.py"), str(recipe.logs / "llama.json"),
                              str(run_dir(output) / "subset.json"), *files], "reference", root, cpu=0, timeout=600)
    assert reference.returncode == 0, _log(recipe, "reference")[-4000:]
    expected = json.loads(_log(recipe, "reference").strip().splitlines()[-1])
    for step, name in zip((STEPS[0], STEPS[-1]), files):
        assert abs(expected[name]["loss"] - section1_loss[step]) <= LOSS_TOLERANCE, (step, expected, section1_loss)
    assert expected[files[0]]["loss"] > expected[files[-1]]["loss"] + 0.5  # training really moved the weights


def test_a_model_of_another_configuration_fails_every_step_naming_the_parameters(recipe, section1):
    root, command = section1
    command = list(command)
    kwargs = json.loads(command[command.index("--model-kwargs") + 1])
    command[command.index("--model-kwargs") + 1] = json.dumps(dict(kwargs, num_layers=1))
    logdir = recipe.root.parent / "wrong-model"
    _run(recipe, ["-m", "evald", *command, "--logdir", str(logdir)], "evald-wrong-model", root, cpu=1,
         timeout=600)
    rows = ledger_rows(root / "output", logdir)
    assert [(r["step"], r["state"]) for r in rows] == [(s, "failed") for s in STEPS], rows
    assert all("layers.1." in r["reason"] for r in rows), rows[0]["reason"]
    assert scalar_points(run_dir(root / "output", logdir), "eval/loss") == []  # no plausible number


def test_the_plain_install_fails_here_for_the_reason_the_page_gives(recipe):
    [install] = [line for language, code in blocks(recipe.page) if language == "bash"
                 for line in code.splitlines() if line.startswith("pip install") and "mindformers" in line]
    args = install.split()[2:]
    done = subprocess.run([str(MF_PYTHON), "-m", "pip", "install", "--dry-run", *[a.strip('"') for a in args]], capture_output=True, text=True, timeout=600)
    assert done.returncode != 0 and "hyper-parallel" in (done.stdout + done.stderr), (
        "the index now has hyper-parallel: docs/mindformers.md's install section can say so\n"
        + (done.stdout + done.stderr)[-2000:])
