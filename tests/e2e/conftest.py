"""Fixtures of the real-process layer: a MindSpore trainer, evald, on private loopback endpoints."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.harness import Proc, private_endpoints, start_evald, start_trainer


@pytest.fixture
def endpoints():
    """Unique ipc endpoints (short paths: ipc names are limited to ~107 bytes)."""
    return private_endpoints()


@pytest.fixture
def procs():
    """Processes started by a test; all killed at teardown, whatever happened."""
    started: list[Proc] = []
    yield started
    for proc in started:
        proc.kill()


@dataclass
class FinishedTraining:
    ckpt: Path    # this test's own copy of the run's checkpoint directory
    output: str   # the trainer's log


def _exit_code(proc: Proc, timeout: float) -> int | None:
    """The process's exit code, or None if it did not exit in time (then it is killed)."""
    try:
        return proc.popen.wait(timeout=timeout)
    except Exception:  # noqa: BLE001 - subprocess.TimeoutExpired: the tests that need it fail, with its log
        return None


@pytest.fixture(scope="session")
def _finished_training_run(tmp_path_factory):
    """One real training run for the whole session: examples/tiny_lm, custom loop, 40 steps, a checkpoint
    every 10, nobody listening on its endpoints (private ones no evald ever binds). Several tests only
    need such a finished run on disk; training it once instead of once per test saves a MindSpore start,
    a compile and the steps each time."""
    work = tmp_path_factory.mktemp("finished-training")
    trainer = start_trainer(work, work / "ckpt", private_endpoints(), steps=40, every=10, loop="custom")
    try:
        code = _exit_code(trainer, 300)
        output = trainer.output()
    finally:
        trainer.kill()
    return code, output, work / "ckpt"


@pytest.fixture
def finished_training(_finished_training_run, tmp_path) -> FinishedTraining:
    """The session's finished training run (see above), its checkpoint directory copied to tmp_path/ckpt
    for this test alone (evald writes its run directory beside it, in tmp_path/tensorboard)."""
    code, output, ckpt = _finished_training_run
    assert code == 0, f"the shared training run exited {code}:\n{output[-3000:]}"
    copy = tmp_path / "ckpt"
    shutil.copytree(ckpt, copy, symlinks=True)
    return FinishedTraining(copy, output)


@dataclass
class SideBySideRun:
    ckpt: Path            # work/demo/ckpt, the demo's layout; evald's run directory is work/demo/tensorboard/demo
    trainer_code: int | None
    trainer_output: str
    evald_code: int | None
    evald_output: str


@pytest.fixture(scope="session")
def side_by_side_run(tmp_path_factory) -> SideBySideRun:
    """The demo, once per session: a real evald given no directory and no model (--lag-policy all), and a
    real training run beside it (Model.train, 60 steps, a checkpoint every 20) that announces itself to it;
    both waited for. tests/e2e/test_end_to_end.py checks what evald wrote, tests/e2e/test_views.py what
    TensorBoard shows of it (in a copy). Read it, do not write to it."""
    work = tmp_path_factory.mktemp("side-by-side")
    env = private_endpoints()
    evald = start_evald(work, env, ["--lag-policy", "all"])
    trainer = start_trainer(work, work / "demo" / "ckpt", env, steps=60, every=20)
    try:
        trainer_code = _exit_code(trainer, 300)
        evald_code = _exit_code(evald, 180)
        run = SideBySideRun(work / "demo" / "ckpt", trainer_code, trainer.output(), evald_code, evald.output())
    finally:
        trainer.kill()
        evald.kill()
    return run
