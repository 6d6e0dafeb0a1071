"""Snapshots written in parts by several real ranks, evaluated by one real evald.

* A real msrun data-parallel job ($EVALD_MSRUN_WORKERS CPU workers, default 4)
  with the hook on every rank: each step's checkpoint is written in N parts;
  one evald evaluates each step exactly once (one TensorBoard point per step),
  and the assembled weights and the loss equal those of a single-writer
  snapshot of the same weights (evaluated by a second evald).
* Separate processes, each holding its own part of one model (like pipeline
  stages): evald assembles their parts and gets the whole model's loss.
* One rank SIGKILLed while writing its part: that step is recorded as
  incomplete, naming the missing rank, never evaluated; later steps are.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest

from evald.contracts import layout, partition, wire
from tests.faults import ledger_rows, tb_texts
from tests.harness import PYTHON, Proc, base_env, raw_scalar_steps, run_dir, scalar_points, wait_for
from tests.partition_worker import DATA_FACTORY, MODEL_FACTORY

REPO = Path(__file__).resolve().parents[2]
WORKER = REPO / "tests" / "partition_worker.py"
VENV_BIN = REPO / ".venv" / "bin"
if not VENV_BIN.exists():
    VENV_BIN = Path(PYTHON).parent
WORKERS = int(os.environ.get("EVALD_MSRUN_WORKERS", "4"))
EVERY = 20


@pytest.fixture
def work(procs):
    path = Path(tempfile.mkdtemp(prefix="evp-"))  # short: ipc paths must fit in sockaddr_un
    (path / "out").mkdir()
    yield path
    for proc in procs:
        proc.kill()
    shutil.rmtree(path, ignore_errors=True)


def _endpoints(work: Path) -> dict[str, str]:
    return {"endpoint": f"ipc://{work}/n.sock", "control": f"ipc://{work}/c.sock"}


def _evald(work: Path, ckpt: Path, name: str, *, endpoint: str = "none", control: str = "none",
           parts_timeout_s: float = 120.0) -> Proc:
    sockets = ["--endpoint", endpoint] + (["--control-endpoint", control] if endpoint != "none" else [])
    cmd = [PYTHON, "-m", "evald", "--ckpt-dir", str(ckpt), *sockets, "--lag-policy", "all", "--subset-size", "32",
           "--batch-size", "16", "--generation", '{"prompts": 0}',
           "--tuning", json.dumps({"rescan_interval_s": 1.0, "parts_timeout_s": parts_timeout_s})]
    env = base_env()
    env.pop("EVALD_RUN_ID", None)
    return Proc(cmd, env, work / f"{name}.log")


def _worker(work: Path, ckpt: Path, name: str, *args: str) -> Proc:
    ends = _endpoints(work)
    env = base_env()
    env.pop("EVALD_RUN_ID", None)
    return Proc([PYTHON, str(WORKER), "--ckpt-dir", str(ckpt), "--out-dir", str(work / "out"), "--endpoint",
                 ends["endpoint"], "--control-endpoint", ends["control"], *args], env, work / f"{name}.log")


def _evaluate_reference(work: Path, ref: Path, final_step: int, procs: list) -> dict[int, float]:
    """The single-writer snapshots, evaluated by a second evald: eval/loss by step."""
    model = wire.FactorySpec(MODEL_FACTORY["target"], MODEL_FACTORY["kwargs"], str(REPO))
    data = wire.FactorySpec(DATA_FACTORY["target"], DATA_FACTORY["kwargs"], str(REPO))
    layout.write_run_file(ref, wire.RunAnnounced(run_id="reference", ckpt_dir=str(ref), model_factory=model,
                                                 data_factory=data).encode().decode())
    layout.write_run_end(ref, wire.RunFinished(run_id="reference", ckpt_dir=str(ref),
                                               final_step=final_step).encode().decode())
    evald = _evald(work, ref, "evald-reference")
    procs.append(evald)
    assert evald.wait(300) == 0, evald.output()[-4000:]
    return {step: value for step, _, value in scalar_points(run_dir(ref), "eval/loss")}


def _parts_of(ckpt: Path) -> dict[int, list[str]]:
    found: dict[int, list[str]] = {}
    for entry in sorted(os.listdir(ckpt)):
        parsed = partition.parse_part_dir_name(entry)
        if parsed:
            found.setdefault(parsed[0], []).append(entry)
    return found


def _assembled(ckpt: Path, step: int, count: int) -> dict[str, np.ndarray]:
    """The full weights of a partitioned step, put together here with numpy (an independent reference)."""
    full: dict[str, np.ndarray] = {}
    for index in range(count):
        path = ckpt / partition.part_dir_name(step, index, count)
        manifest = layout.read_manifest(path)
        arrays = layout.read_checkpoint(path, manifest)
        for p in manifest.params:
            if p.sliced is None:
                assert p.name not in full
                full[p.name] = arrays[p.name]
            else:
                target = full.setdefault(p.name, np.full(p.sliced.global_shape, np.nan, arrays[p.name].dtype))
                target[tuple(slice(a, b) for a, b in p.sliced.region)] = arrays[p.name]
    return full


def _same_weights(ckpt: Path, ref: Path, step: int, count: int) -> None:
    whole_dir = ref / layout.step_dir_name(step)
    whole = layout.read_checkpoint(whole_dir, layout.read_manifest(whole_dir))
    parts = _assembled(ckpt, step, count)
    assert sorted(parts) == sorted(whole)
    for name in whole:
        assert parts[name].tobytes() == whole[name].tobytes(), (step, name)


def _losses(logdir: Path) -> dict[int, float]:
    points = scalar_points(logdir, "eval/loss")
    return {step: value for step, _, value in points}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _msrun() -> str | None:
    path = VENV_BIN / "msrun"
    return str(path) if path.exists() else shutil.which("msrun")


# ---------------------------------------------------------------- data parallel under msrun


@pytest.mark.skipif(_msrun() is None, reason="msrun not found")
def test_msrun_data_parallel_job_is_evaluated_once_per_step_from_its_parts(work, procs):
    ckpt, ref = work / "ckpt", work / "ref"
    ref.mkdir()
    ends = _endpoints(work)
    evald = _evald(work, ckpt, "evald", endpoint=ends["endpoint"], control=ends["control"])
    procs.append(evald)
    steps, every = 30, 10  # 3 snapshots; 4 ranks on 2 cores train at about 1 step/s
    env = base_env({"PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"})
    env.pop("EVALD_RUN_ID", None)
    cmd = [_msrun(), f"--worker_num={WORKERS}", f"--local_worker_num={WORKERS}", f"--master_port={_free_port()}",
           f"--log_dir={work / 'msrun'}", "--join=True", "--cluster_time_out=200", str(WORKER), "--mode", "dp",
           "--ckpt-dir", str(ckpt), "--ref-dir", str(ref), "--out-dir", str(work / "out"), "--endpoint",
           ends["endpoint"], "--control-endpoint", ends["control"], "--steps", str(steps), "--every", str(every)]
    job = subprocess.run(cmd, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
    logs = "\n".join(p.read_text(errors="replace")[-2000:] for p in sorted((work / "msrun").glob("*.log")))
    assert job.returncode == 0, f"msrun exited {job.returncode}\n{job.stdout.decode()[-3000:]}\n{logs}"
    assert evald.wait(300) == 0, evald.output()[-4000:]

    results = [json.loads((work / "out" / f"rank_{r}.json").read_text()) for r in range(WORKERS)]
    assert len({r["run_id"] for r in results}) == 1, results   # agreed through MindSpore's AllReduce
    assert all(r["errors"] == 0 and r["writers"] == list(range(WORKERS)) for r in results), results
    snapshot_steps = list(range(every, steps + 1, every))
    parts = _parts_of(ckpt)
    assert sorted(parts) == snapshot_steps and all(len(v) == WORKERS for v in parts.values()), parts
    assert layout.list_committed(ckpt) == []                    # no rank wrote a whole snapshot
    sizes = [sum(f.bytes for f in layout.read_manifest(ckpt / name).files) for name in parts[every]]
    assert max(sizes) < 2.0 * sum(sizes) / WORKERS, sizes       # each rank wrote about 1/N of the bytes

    rows = ledger_rows(ckpt)
    assert [(r["step"], r["state"]) for r in rows] == [(s, "evaluated") for s in snapshot_steps], rows
    assert raw_scalar_steps(run_dir(ckpt), "eval/loss") == snapshot_steps   # one point per step, raw
    for step in snapshot_steps:
        _same_weights(ckpt, ref, step, WORKERS)
    losses, reference = _losses(run_dir(ckpt)), _evaluate_reference(work, ref, steps, procs)
    print(f"\nPARTS-REPORT msrun {WORKERS} workers: part bytes at step {every} {sizes}; loss from parts {losses}; "
          f"single-writer snapshot {reference}")
    assert losses == reference and len(losses) == len(snapshot_steps)


# ---------------------------------------------------------------- ranks holding different parameters


def test_ranks_holding_different_parameters_are_assembled_into_the_whole_model(work, procs):
    ckpt, ref = work / "ckpt", work / "ref"
    ref.mkdir()
    ends = _endpoints(work)
    evald = _evald(work, ckpt, "evald", endpoint=ends["endpoint"], control=ends["control"])
    procs.append(evald)
    ranks = [_worker(work, ckpt, f"rank{r}", "--mode", "split", "--holds", "--rank", str(r), "--world", "2",
                     "--run-id", "split-run", "--ref-dir", str(ref) if r == 0 else str(work / "unused"),
                     "--steps", "60") for r in range(2)]
    procs.extend(ranks)
    for proc in ranks:
        assert proc.wait(300) == 0, proc.output()[-3000:]
    assert evald.wait(300) == 0, evald.output()[-4000:]
    steps = [20, 40, 60]
    parts = _parts_of(ckpt)
    assert sorted(parts) == steps and all(len(v) == 2 for v in parts.values()), parts
    held = [{p.name for p in layout.read_manifest(ckpt / name).params} for name in parts[20]]
    assert held[0] and held[1] and not held[0] & held[1]       # each rank its own parameters
    assert [(r["step"], r["state"]) for r in ledger_rows(ckpt)] == [(s, "evaluated") for s in steps]
    assert raw_scalar_steps(run_dir(ckpt), "eval/loss") == steps
    for step in steps:
        _same_weights(ckpt, ref, step, 2)
    losses, reference = _losses(run_dir(ckpt)), _evaluate_reference(work, ref, 60, procs)
    print(f"\nPARTS-REPORT held: parts {dict(parts)}; loss from parts {losses}; whole {reference}")
    assert losses == reference and len(losses) == len(steps)


# ---------------------------------------------------------------- a rank killed mid-write


@pytest.mark.slow  # a long fault/load run: ./scripts/test.sh -m slow
def test_a_rank_killed_mid_write_leaves_its_step_incomplete_and_later_steps_are_evaluated(work, procs):
    ckpt = work / "ckpt"
    ends = _endpoints(work)
    evald = _evald(work, ckpt, "evald", endpoint=ends["endpoint"], control=ends["control"], parts_timeout_s=10)
    procs.append(evald)
    hold = work / "go-on"
    common = ["--mode", "split", "--world", "2", "--run-id", "kill-run", "--steps", "80", "--step-sleep", "0.02"]
    rank0 = _worker(work, ckpt, "rank0", *common, "--rank", "0", "--hold-after-step", "40", "--hold-file", str(hold))
    rank1 = _worker(work, ckpt, "rank1", *common, "--rank", "1", "--pause-at-step", "40", "--pause-s", "60")
    procs.extend([rank0, rank1])
    temp = ".step_000000040-part-00001-of-00002.tmp-"
    wait_for(lambda: "pausing" in rank1.output() and any(e.startswith(temp) for e in os.listdir(ckpt)), 240,
             "rank 1 writing its part of step 40")
    rank1.signal(signal.SIGKILL)                                # mid-write: its temp directory is there
    rank1.popen.wait(10)
    assert not (ckpt / partition.part_dir_name(40, 1, 2)).exists()
    restarted = _worker(work, ckpt, "rank1-again", *common, "--rank", "1", "--first-step", "41")
    procs.append(restarted)
    wait_for(lambda: (ckpt / partition.part_dir_name(60, 1, 2)).exists(), 240, "the restarted rank's step 60")
    hold.touch()                                                # rank 0 goes on to 60 and 80
    assert rank0.wait(240) == 0, rank0.output()[-3000:]
    assert restarted.wait(240) == 0, restarted.output()[-3000:]
    assert evald.wait(300) == 0, evald.output()[-4000:]

    rows = {r["step"]: r for r in ledger_rows(ckpt)}
    assert {s: r["state"] for s, r in rows.items()} == {20: "evaluated", 40: "skipped", 60: "evaluated",
                                                          80: "evaluated"}, rows
    reason = rows[40]["reason"]
    assert reason.startswith("incomplete:") and "missing part 1 (rank 1)" in reason, reason
    assert raw_scalar_steps(run_dir(ckpt), "eval/loss") == [20, 60, 80]
    assert [(step, tag) for step, tag, _ in tb_texts(run_dir(ckpt), "evald/skipped")] == [(40, "evald/skipped")]
    assert any(e.startswith(temp) for e in os.listdir(ckpt))   # evald never touches the trainer's temps
