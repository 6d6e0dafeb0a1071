"""A real MindSpore CPU data-parallel job under msrun obeys evald's stop decision.

The test binds the control PUB socket (as evald does), publishes
``ControlState(stop_at_step=S)`` every 50 ms, launches tests/msrun_worker.py on
$EVALD_MSRUN_WORKERS (default 4) CPU workers and checks that

* msrun exits 0 within the timeout (no rank hung in a collective);
* every rank stopped at exactly S, having agreed through MindSpore's
  AllReduce-SUM that EvaldCallback picked up by itself (``mindspore_reduce_sum``);
* every rank wrote its part of the final checkpoint ``ckpt_dir/step_<S:09d>-part-<r>-of-<N>/``;
* the ranks' weights are identical (data parallel really ran).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

zmq = pytest.importorskip("zmq")

from evald.contracts import layout, partition  # noqa: E402
from evald.contracts.wire import ControlState  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
WORKER = REPO / "tests" / "msrun_worker.py"
VENV_BIN = REPO / ".venv" / "bin"
WORKERS = int(os.environ.get("EVALD_MSRUN_WORKERS", "4"))
STOP_AT = 37
EVERY_N = 20
STEPS = 150
TIMEOUT_S = 240


def _msrun() -> str | None:
    if (VENV_BIN / "msrun").exists() and (VENV_BIN / "python").exists():
        return str(VENV_BIN / "msrun")
    return shutil.which("msrun")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Publisher:
    """Binds PUB like evald; once ``after()`` holds (or ``after_timeout_s`` passed), re-publishes."""

    def __init__(self, endpoint: str, state: ControlState, interval_s: float = 0.05,
                 after=None, after_timeout_s: float = 90.0) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.PUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(endpoint)
        self.sent = 0
        self._stop = threading.Event()

        self.started_at: float | None = None

        def run():
            deadline = time.monotonic() + after_timeout_s
            while after is not None and not after() and time.monotonic() < deadline:
                if self._stop.wait(0.005):
                    return
            self.started_at = time.monotonic()
            while not self._stop.is_set():
                self.sock.send(state.encode())
                self.sent += 1
                self._stop.wait(interval_s)

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close(linger=0)
        self.ctx.term()


@pytest.mark.skipif(_msrun() is None, reason="msrun not found (mindspore not installed in .venv)")
def test_msrun_data_parallel_stops_at_published_step():
    pytest.importorskip("mindspore")
    work = Path(tempfile.mkdtemp(prefix="evm-"))  # short: ipc paths must fit in sockaddr_un
    try:
        _run(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run(work: Path) -> None:
    ckpt_dir, out_dir, log_dir = work / "ckpt", work / "out", work / "logs"
    out_dir.mkdir()
    control = f"ipc://{work}/control.sock"
    notify = f"ipc://{work}/notify.sock"  # nobody listens: notifications are fire-and-forget
    run_id = f"msrun-{os.getpid()}"
    env = dict(os.environ)
    env.update(GLOG_v="3", PYTHONPATH=str(REPO), PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}")
    env.pop("EVALD_RUN_ID", None)
    cmd = [_msrun(), f"--worker_num={WORKERS}", f"--local_worker_num={WORKERS}",
           f"--master_port={_free_port()}", f"--log_dir={log_dir}", "--join=True",
           "--cluster_time_out=120", str(WORKER),
           "--ckpt-dir", str(ckpt_dir), "--endpoint", notify, "--control-endpoint", control,
           "--run-id", run_id, "--out-dir", str(out_dir), "--steps", str(STEPS),
           "--every-n-steps", str(EVERY_N)]

    # Publish only once rank 0 committed its part of the step-EVERY_N checkpoint, so the agreement first
    # runs ~EVERY_N zero-vote AllReduces (no false stop), then carries the decision; S - EVERY_N
    # steps (seconds here) are left for the message to arrive, so the stop is at exactly S.
    first_ckpt = ckpt_dir / partition.part_dir_name(EVERY_N, 0, WORKERS) / layout.MANIFEST_FILE
    pub = _Publisher(control, ControlState(run_id=run_id, seq=1, stop_at_step=STOP_AT, reason="test stop"),
                     after=first_ckpt.exists)
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(cmd, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            out, _ = proc.communicate()
            pytest.fail(f"msrun still running after {TIMEOUT_S}s (a rank hung?)\n"
                        f"{_tail(out)}\n{_worker_logs(log_dir)}")
    finally:
        pub.close()
    wall = time.monotonic() - t0

    assert proc.returncode == 0, f"msrun exited {proc.returncode}\n{_tail(out)}\n{_worker_logs(log_dir)}"

    results = []
    for r in range(WORKERS):
        path = out_dir / f"rank_{r}.json"
        assert path.exists(), f"rank {r} wrote no result\n{_worker_logs(log_dir)}"
        results.append(json.loads(path.read_text()))
    print(f"\nmsrun {WORKERS} workers, wall {wall:.1f}s; results: {json.dumps(results, indent=1)}")

    shipped_broken = any(res["probe_error"] for res in results)
    for r, res in enumerate(results):
        assert res["world_size"] == WORKERS and res["hook_world_size"] == WORKERS and res["hook_rank"] == r
        # The agreement ran through a MindSpore AllReduce-SUM on every step until the decision
        # was agreed, and never after.
        expected = "float32_reduce_sum" if shipped_broken else "mindspore_reduce_sum"
        assert res["agreement_collective"] and expected in res["agreement_collective"], res
        assert EVERY_N <= res["agreement_collective_calls"] < STOP_AT, res
        assert res["agreement_collective_calls"] == results[0]["agreement_collective_calls"], res
        assert res["subscriber"] == (r == 0), res
        assert res["agreed_stop_step"] == STOP_AT, res
        assert res["final_step"] == STOP_AT, f"rank {r} stopped at {res['final_step']}, not {STOP_AT}"
        assert res["hook_errors"] == 0, res
    assert results[0]["stop_reason"] == "test stop"
    for r in range(WORKERS):
        log_text = (log_dir / f"worker_{r}.log").read_text(errors="replace")
        assert f"stopping at step {STOP_AT}" in log_text, f"worker_{r}.log:\n{log_text[-3000:]}"
    assert len({round(res["weights_abs_sum"], 5) for res in results}) == 1, "weights differ across ranks"

    for r in range(WORKERS):  # every rank writes its part of each snapshot (docs/checkpoint-layout.md)
        manifest = ckpt_dir / partition.part_dir_name(STOP_AT, r, WORKERS) / layout.MANIFEST_FILE
        assert manifest.exists(), f"no final part {r} at step {STOP_AT}: {sorted(os.listdir(ckpt_dir))}"
        assert layout.read_manifest(manifest.parent).step == STOP_AT
    committed = sorted({p[0] for p in map(partition.parse_part_dir_name, os.listdir(ckpt_dir)) if p})
    assert committed == [EVERY_N, STOP_AT], committed  # periodic + final, in parts

    # The collective EvaldCallback picks by itself (mindspore_reduce_sum): rank r sent [r, 1].
    for res in results:
        assert res["probe_error"] is None, (
            f"trainer_hooks.stop_agreement.mindspore_reduce_sum() fails on rank {res['rank']}: "
            f"{res['probe_error']}")
        assert res["probe_sum"] == [sum(range(WORKERS)), WORKERS], res


def _tail(out: bytes, n: int = 4000) -> str:
    return out.decode(errors="replace")[-n:]


def _worker_logs(log_dir: Path, n: int = 3000) -> str:
    parts = []
    for path in sorted(log_dir.glob("*.log")):
        parts.append(f"--- {path.name} ---\n{path.read_text(errors='replace')[-n:]}")
    return "\n".join(parts)
