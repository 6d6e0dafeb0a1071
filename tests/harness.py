"""Starting and reading back the real things: trainer, evald, TensorBoard event files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable


def private_socket_dir() -> str:
    """A new private directory with a short path, for ipc sockets (ipc names are limited to ~107 bytes)."""
    import tempfile

    path = tempfile.mkdtemp(prefix="evt")
    os.chmod(path, 0o700)
    return path


def private_endpoints() -> dict[str, str]:
    """The environment that points a trainer and an evald at unique ipc endpoints of their own."""
    sockets = Path(private_socket_dir())
    return {"EVALD_ENDPOINT": f"ipc://{sockets}/n.sock", "EVALD_CONTROL_ENDPOINT": f"ipc://{sockets}/c.sock",
            "EVALD_SOCKET_DIR": str(sockets)}


def base_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"GLOG_v": "3", "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"})
    env.update(extra or {})
    return env


class Proc:
    def __init__(self, args: Sequence[str], env: dict[str, str], log_path: Path) -> None:
        self.args = list(args)
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.popen = subprocess.Popen(self.args, env=env, cwd=str(REPO), stdout=self._log,
                                      stderr=subprocess.STDOUT, start_new_session=True)

    def wait(self, timeout: float) -> int:
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{self.args[:4]} did not exit in {timeout}s; log:\n{self.output()[-4000:]}") from None

    def output(self) -> str:
        if not self._log.closed:  # closed once the process was killed: the file holds everything
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def signal(self, sig: int) -> None:
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, sig)

    def kill(self) -> None:
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.popen.wait(timeout=10)
        self._log.close()


def start_trainer(tmp: Path, ckpt_dir: Path, env: dict[str, str], *, steps: int = 60, every: int = 20,
                  loop: str = "model", extra: Sequence[str] = (), name: str = "trainer", cpu: int | None = 0,
                  program: Sequence[str] = ("examples.tiny_lm.train",)) -> Proc:
    """examples/tiny_lm's trainer; ``program``: the module run with ``-m`` (and its own arguments) in its place,
    one that takes the trainer's arguments too (tests/paced_trainer.py)."""
    args = [PYTHON, "-m", *program, "--ckpt-dir", str(ckpt_dir), "--steps", str(steps),
            "--every", str(every), "--loop", loop, *extra]
    if cpu is not None:
        args += ["--cpu", str(cpu)]
    return Proc(args, base_env(env), tmp / f"{name}.log")


def start_evald(tmp: Path, env: dict[str, str], args: Sequence[str] = (), name: str = "evald",
                cpu: str | None = "1") -> Proc:
    cmd = [PYTHON, "-m", "evald", "--subset-size", "64", "--batch-size", "16", "--generation",
           '{"prompts": 2, "new_tokens": 8}', *args]
    if cpu is not None:
        cmd += ["--cpu-affinity", cpu]
    return Proc(cmd, base_env(env), tmp / f"{name}.log")


# ---------------------------------------------------------------- where evald writes (docs/architecture.md)
# A run directory LOGDIR/RUN_NAME holds evald's state (ledger.sqlite, summary.json, ...) and one
# TensorBoard sub-run per stream, train/ and eval/, where a tag loses its stream's prefix
# (eval/loss is written as "loss" in eval/). The helpers below take a run directory and the
# ledger's tag names (eval/loss, train/loss, evald/..., health/..., sample/...) and read the
# sub-run that holds them, so a test states what it expects in evald's own terms.

KEPT_NAMESPACES = {"eval": ("evald/", "sample/"), "train": ("health/",)}


def run_dir(ckpt_dir: Path, logdir: Path | None = None) -> Path:
    """The run directory evald uses for ``ckpt_dir`` (found by its evald-run.json), by default
    in CKPT_DIR/../tensorboard; before evald made it, where it will be."""
    from evald.daemon.run_dir import default_logdir, default_run_name

    ckpt_dir = Path(ckpt_dir).resolve()
    logdir = Path(logdir) if logdir else default_logdir(ckpt_dir)
    for identity in sorted(logdir.glob("*/evald-run.json")):
        try:
            if json.loads(identity.read_text())["ckpt_dir"] == str(ckpt_dir):
                return identity.parent
        except (OSError, ValueError, KeyError):
            continue
    return logdir / default_run_name(ckpt_dir)


def sub_run_of(tag: str) -> tuple[str, str]:
    """(sub-run, tag as written there) of a ledger tag: eval/loss -> (eval, loss)."""
    for stream in ("eval", "train"):
        if tag.startswith(stream + "/"):
            name = tag[len(stream) + 1:]
            return stream, ("Loss" if name == "loss" else name)  # evald.sinks.tensorboard_layout.LOSS
    if tag.startswith("serve/"):  # evald --serve's records: their own sub-run, tags kept whole
        return "serve", tag
    return ("train" if tag.startswith("health/") else "eval"), tag


def ledger_tag(sub_run: str, tag: str) -> str:
    """The inverse of sub_run_of: the ledger's name of ``tag`` read in ``sub_run``."""
    if tag.startswith("Samples/"):  # the sample texts (evald.sinks.tensorboard_layout.shown_text_tag)
        return "sample/" + tag[len("Samples/"):]
    if sub_run not in KEPT_NAMESPACES or tag.startswith(KEPT_NAMESPACES[sub_run]):
        return tag
    if tag == "Loss":  # train/loss and eval/loss are shown as Loss (evald.sinks.tensorboard_layout.LOSS)
        return f"{sub_run}/loss"
    return f"{sub_run}/{tag}"


def event_files(run: Path) -> list[tuple[str, Path]]:
    """(sub-run, path) of every event file in a run directory."""
    return [(path.parent.name, path) for path in sorted(Path(run).glob("*/events.out.tfevents.*"))]


def scalar_points(run: Path, tag: str) -> list[tuple[int, float, float]]:
    """(step, wall_time, value) for the ledger tag ``tag``, read with TensorBoard's own EventAccumulator."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sub_run, shown = sub_run_of(tag)
    if not (Path(run) / sub_run).is_dir():
        return []
    acc = EventAccumulator(str(Path(run) / sub_run), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    if shown not in acc.Tags().get("scalars", []):
        return []
    return [(e.step, e.wall_time, e.value) for e in acc.Scalars(shown)]


def text_events(run: Path, tag: str) -> list[tuple[int, str]]:
    """(step, text) of a tensorboardX text summary (tag + "/text_summary"), via EventAccumulator."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from evald.sinks.tensorboard_layout import shown_text_tag

    sub_run, shown = sub_run_of(tag)
    shown = shown_text_tag(shown)  # sample/greedy is shown as Samples/greedy
    if not (Path(run) / sub_run).is_dir():
        return []
    acc = EventAccumulator(str(Path(run) / sub_run), size_guidance={"tensors": 0})
    acc.Reload()
    if shown not in acc.Tags().get("tensors", []):
        return []
    return [(e.step, e.tensor_proto.string_val[0].decode()) for e in acc.Tensors(shown)]


def raw_scalar_steps(run: Path, tag: str) -> list[int]:
    """Every step at which ``tag`` occurs in any event file, read raw (purge logic cannot hide duplicates)."""
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto import event_pb2

    steps = []
    for sub_run, path in event_files(run):
        for raw in RawEventFileLoader(str(path)).Load():
            event = event_pb2.Event.FromString(raw)
            if any(ledger_tag(sub_run, v.tag) == tag for v in event.summary.value):
                steps.append(event.step)
    return sorted(steps)


def hook_stats(trainer_output: str) -> dict:
    """The trainer hook's counters, as examples/tiny_lm/train.py prints them (one JSON line)."""
    return json.loads(trainer_output.split("evald hook:", 1)[1].splitlines()[0])


def committed_steps(ckpt_dir: Path) -> list[int]:
    from evald.contracts.layout import list_committed

    return [step for step, _ in list_committed(ckpt_dir)]


def wait_for(predicate, timeout: float, what: str, interval: float = 0.2):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
