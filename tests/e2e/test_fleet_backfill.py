"""A backfill fleet (issue 30): workers as real processes sharing only a directory, the merge, the
recipes' worker index, and `evald export` read back by lm-eval's and Every Eval Ever's own tools.

One run is set up once for the module (8 checkpoints validated by a real evald, without the suite),
then a fleet of 3 `evald backfill --fleet-dir` workers backfills suite ``mc``; worker 1 is killed with
SIGKILL mid-cell (after it loaded a snapshot, before that cell's file exists) and its index rerun; a
second fleet of ONE worker evaluates the same cells into another directory, meanwhile. Everything
is a real process and a real file; no cluster runs here, so the Slurm script and the Kubernetes
manifest's command are run with the variables the engines set.
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from examples.tiny_lm.benchmarks import write_benchmarks
from tests import faults
from tests.harness import PYTHON, REPO, Proc, base_env, raw_scalar_steps, run_dir, wait_for
from tests.tensorboard_http import TensorBoard

pytestmark = pytest.mark.heavy  # minutes of several processes: CI's third stage (./scripts/test.sh --long)

STEPS = list(range(10, 90, 10))            # 8 checkpoints
TAG = "eval/mc/stdlib_next_line/acc"


def _evald(*args: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "evald", *args], cwd=REPO, env=base_env(env), capture_output=True,
                          text=True, timeout=timeout)


def _worker(tmp: Path, ckpt: Path, fleet: Path, config: Path, index: int, count: int, name: str) -> Proc:
    return Proc([PYTHON, "-m", "evald", "backfill", "--suite", "mc", "--ckpt-dir", str(ckpt), "--fleet-dir",
                 str(fleet), "--config", str(config), "--worker-index", str(index), "--worker-count", str(count)],
                base_env({"HF_HOME": str(tmp / "hf")}), tmp / f"{name}.log")


def _journal(fleet: Path) -> list[dict]:
    from evald.daemon.fleet_cells import journal_events

    return journal_events(fleet)


def _cell_bodies(fleet: Path, ckpt: Path) -> dict[int, dict]:
    """The fleet's cells, their seals checked with the run's key (RUN_DIR/fleet.key, made by the first worker)."""
    from evald.daemon.fleet_cells import read_cell, scan_cells
    from evald.daemon.fleet_key import FleetKeyError, fleet_key

    try:
        key = fleet_key(run_dir(ckpt), None, create=False)
    except FleetKeyError:
        return {}       # no worker has started yet
    bodies = [read_cell(fleet, relative, key) for relative in scan_cells(fleet).cells]
    return {body["step"]: body for body in bodies}


@pytest.fixture(scope="module")
def fleet_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fleet")
    ckpt = tmp / "ckpt"
    faults.announce(ckpt)
    for step in STEPS:
        faults.commit(ckpt, step)
    include = write_benchmarks(tmp / "bench", next_line_count=24, bpb_docs_per_set=1)
    common = ('tokenizer_factory = "examples.tiny_lm.benchmarks:build_tokenizer"\nsubset_size = 16\n'
              'batch_size = 16\n[generation]\nprompts = 0\n')
    (tmp / "base.toml").write_text(common)
    config = tmp / "evald.toml"
    config.write_text(common + f'[suites.mc]\ninclude_path = [{json.dumps(include)}]\ntasks = ["stdlib_next_line"]\n'
                               'limit = 8\nbatch_size = 4\n')
    procs: list[Proc] = []
    try:
        # the run: 8 checkpoints validated by evald, which knows no suite yet
        first = faults.start(tmp, ckpt, "--config", str(tmp / "base.toml"), "--lag-policy", "all",
                             "--idle-exit-s", "2")
        procs.append(first)
        assert first.wait(900) == 0, first.output()[-3000:]

        fleet = tmp / "fleet"
        workers = [_worker(tmp, ckpt, fleet, config, i, 3, f"worker-{i}") for i in range(3)]
        procs += workers

        def loaded_mid_cell():   # worker 1 swapped a snapshot in and has not written that cell yet
            loads = [e["step"] for e in _journal(fleet) if e["worker"] == 1 and e["event"] == "load"]
            return bool(loads) and loads[-1] not in _cell_bodies(fleet, ckpt) and loads[-1]
        killed_at = wait_for(loaded_mid_cell, 900, "worker 1 evaluating a cell", interval=0.02)
        workers[1].signal(signal.SIGKILL)
        workers[1].wait(30)
        killed_mid_cell = killed_at not in _cell_bodies(fleet, ckpt)

        single = tmp / "fleet-single"    # the same cells from one worker, meanwhile
        one = _worker(tmp, ckpt, single, config, 0, 1, "single")
        rerun = _worker(tmp, ckpt, fleet, config, 1, 3, "worker-1-again")
        procs += [one, rerun]
        for proc in (workers[0], workers[2], rerun, one):
            assert proc.wait(900) == 0, proc.output()[-3000:]
        yield {"tmp": tmp, "ckpt": ckpt, "config": config, "fleet": fleet, "single": single, "killed_at": killed_at,
               "killed_mid_cell": killed_mid_cell, "include": include,
               "outputs": {"rerun": rerun.output(), "w0": workers[0].output()}}
    finally:
        for proc in procs:
            proc.kill()


def test_three_workers_a_sigkill_and_a_rerun_give_every_cell_once(fleet_run):
    ckpt, fleet = fleet_run["ckpt"], fleet_run["fleet"]
    assert fleet_run["killed_mid_cell"], "worker 1 was not killed mid-cell"
    bodies = _cell_bodies(fleet, ckpt)
    assert sorted(bodies) == STEPS and all(b["state"] == "evaluated" for b in bodies.values())

    merged = _evald("backfill", "--ckpt-dir", str(ckpt), "--fleet-dir", str(fleet), "--merge")
    assert merged.returncode == 0, merged.stdout + merged.stderr
    assert "8 cell(s) taken in; 0 already in the ledger" in merged.stdout
    again = _evald("backfill", "--ckpt-dir", str(ckpt), "--fleet-dir", str(fleet), "--merge")
    assert "0 cell(s) taken in; 8 already in the ledger" in again.stdout      # a second merge counts nothing twice

    import sqlite3

    db = sqlite3.connect(faults.ledger_path(ckpt))
    cells = db.execute("SELECT step, state FROM cells WHERE evaluation='suite:mc' AND superseded_by IS NULL").fetchall()
    db.close()
    assert sorted(cells) == [(s, "evaluated") for s in STEPS]                   # 0 missing, 0 duplicate
    run = run_dir(ckpt)
    assert raw_scalar_steps(run, TAG) == STEPS                                  # one point per step, at its step
    assert len(list((run / "samples" / "mc" / "stdlib_next_line").glob("step_*.jsonl.gz"))) == 8
    # ... and every one of them where a user looks: stock TensorBoard, default flags, which drops points
    # written below a run's latest step (the merge takes cells in the order workers finished them)
    tensorboard = TensorBoard(run.parent, ckpt.parent / "tensorboard.log")
    try:
        shown = tensorboard.until(lambda: [step for step, _ in tensorboard.scalars(f"{run.name}/eval",
                                                                                   TAG.removeprefix("eval/"))],
                                  lambda got: got == STEPS)
    finally:
        tensorboard.close()
    assert shown == STEPS, shown

    # each snapshot read once per worker process that had cells on it, and only in its own share
    plan = json.loads((fleet / "plan.json").read_text())["body"]["snapshots"]
    share = {i: {s["step"] for n, s in enumerate(plan) if n % 3 == i} for i in range(3)}
    loads = [e for e in _journal(fleet) if e["event"] == "load"]
    per_process = Counter((e["worker"], e["pid"], e["step"]) for e in loads)
    assert set(per_process.values()) == {1}
    assert all(e["step"] in share[e["worker"]] for e in loads)
    evaluated_by = {(e["worker"], e["pid"]): {x["step"] for x in _journal(fleet) if x["event"] == "cell"
                                              and x["pid"] == e["pid"]} for e in loads}
    for (_worker, pid), steps in evaluated_by.items():
        loaded = {e["step"] for e in loads if e["pid"] == pid}
        assert steps <= loaded and (loaded - steps) <= {fleet_run["killed_at"]}   # the killed one's last load
    assert len(loads) == 8 + 1            # every snapshot once, and the killed cell's snapshot once more on rerun


def test_one_worker_and_three_give_the_same_cells(fleet_run):
    three, one = _cell_bodies(fleet_run["fleet"], fleet_run["ckpt"]), _cell_bodies(fleet_run["single"], fleet_run["ckpt"])
    assert sorted(one) == STEPS
    for step in STEPS:
        assert one[step]["tasks"] == three[step]["tasks"]           # per-sample records equal, document by document
        assert one[step]["cell_identity"] == three[step]["cell_identity"]
        assert one[step]["provenance"]["weights_sha256"] == three[step]["provenance"]["weights_sha256"]


def test_the_recipes_read_the_worker_index_from_the_engines_variables(fleet_run):
    import yaml

    ckpt, fleet, config = fleet_run["ckpt"], fleet_run["fleet"], fleet_run["config"]
    evald = f"{PYTHON} -m evald"
    slurm = base_env({"SLURM_ARRAY_JOB_ID": "77", "SLURM_ARRAY_TASK_ID": "12", "SLURM_ARRAY_TASK_MIN": "10",
                      "SLURM_ARRAY_TASK_MAX": "12", "SLURM_ARRAY_TASK_COUNT": "3", "CKPT_DIR": str(ckpt),
                      "FLEET_DIR": str(fleet), "SUITE": "mc", "EVALD_CONFIG": str(config), "EVALD": evald})
    done = subprocess.run(["bash", str(REPO / "deploy" / "fleet" / "backfill_array.sbatch")], env=slurm, cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "worker 2 of 3 (SLURM_ARRAY_TASK_ID - SLURM_ARRAY_TASK_MIN, SLURM_ARRAY_TASK_COUNT)" in done.stdout
    assert "0 cell(s) evaluated" in done.stdout and "already done" in done.stdout   # its share is finished
    merge = subprocess.run(["bash", str(REPO / "deploy" / "fleet" / "backfill_array.sbatch"), "merge"], env=slurm,
                           cwd=REPO, capture_output=True, text=True, timeout=300)
    assert merge.returncode == 0 and "have no file yet" not in merge.stdout, merge.stdout + merge.stderr

    (job,) = [d for d in yaml.safe_load_all((REPO / "deploy" / "fleet" / "backfill-indexed-job.yaml").read_text()) if d]
    container = job["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["EVALD_WORKER_COUNT"] == str(job["spec"]["completions"])
    paths = {"/ckpt/exp1": str(ckpt), "/ckpt/fleet-mc": str(fleet), "/etc/evald/evald.toml": str(config)}
    command = [paths.get(a, a) for a in container["command"]]
    assert command[:2] == ["evald", "backfill"]
    done = subprocess.run([PYTHON, "-m", "evald", *command[1:]], cwd=REPO, capture_output=True, text=True,
                          env=base_env({**env, "EVALD_WORKER_COUNT": "3", "JOB_COMPLETION_INDEX": "1"}), timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "worker 1 of 3 (JOB_COMPLETION_INDEX, EVALD_WORKER_COUNT)" in done.stdout


def test_export_is_read_by_lm_evals_and_every_eval_evers_own_tools(fleet_run):
    import yaml

    ckpt, config, tmp = fleet_run["ckpt"], fleet_run["config"], fleet_run["tmp"]
    _evald("backfill", "--ckpt-dir", str(ckpt), "--fleet-dir", str(fleet_run["fleet"]), "--merge")
    out = tmp / "export"
    done = _evald("export", "--ckpt-dir", str(ckpt), "--config", str(config), "--out", str(out), "--step", "30",
                  "--step", "80", env={"HF_HOME": str(tmp / "hf")})
    assert done.returncode == 0, done.stdout + done.stderr
    digests = {s: _cell_bodies(fleet_run["fleet"], ckpt)[s]["provenance"]["weights_sha256"] for s in (30, 80)}

    # lm-eval's files, found and read by lm-eval's own helpers
    from lm_eval.utils import get_latest_filename, get_results_filenames, get_sample_results_filenames, make_table

    files = [str(p) for p in (out / "lm-eval").rglob("*") if p.is_file()]
    for step in (30, 80):
        mine = [f for f in files if f"/step_{step}/" in f]
        results = json.loads(Path(get_latest_filename(get_results_filenames(mine))).read_text())
        assert {"results", "configs", "versions", "n-shot", "n-samples", "task_hashes"} <= set(results)
        assert results["n-samples"]["stdlib_next_line"] == {"original": 24, "effective": 8}
        assert results["evald"]["step"] == step and results["evald"]["weights_sha256"] == digests[step]
        assert "stdlib_next_line" in make_table(results)
        samples = [json.loads(line) for line in Path(get_sample_results_filenames(mine)[0]).read_text().splitlines()]
        assert len(samples) == 8 and all({"doc", "doc_hash", "prompt_hash", "target_hash"} <= set(s) for s in samples)

    # task_hashes equal a stock lm_eval run of the task on the same documents
    ids = sorted(s["doc_id"] for s in samples)
    stock = tmp / "stock"
    run = subprocess.run([PYTHON, "-m", "lm_eval", "--model", "dummy", "--tasks", "stdlib_next_line", "--include_path",
                          fleet_run["include"], "--samples", json.dumps({"stdlib_next_line": ids}), "--log_samples",
                          "--output_path", str(stock)], cwd=tmp, capture_output=True, text=True, timeout=600,
                         env=base_env({"HF_HOME": str(tmp / "hf"), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}))
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    (stock_results,) = stock.rglob("results_*.json")
    assert json.loads(stock_results.read_text())["task_hashes"] == results["task_hashes"]

    # Every Eval Ever: a valid 0.3.0 contribution (its schemas and its validator's rules: tests/every_eval_ever_check.py)
    from tests.every_eval_ever_check import problems

    assert problems(out / "every-eval-ever") == []
    records = sorted((out / "every-eval-ever").rglob("*-*-*-*-*.json"))
    assert len(records) == 2
    for path in records:
        record = json.loads(path.read_text())
        step = int(record["model_info"]["additional_details"]["step"])
        assert record["model_info"]["additional_details"]["weights_sha256"] == digests[step]
        assert record["detailed_evaluation_results"]["total_rows"] == 16          # acc and acc_norm, 8 documents

    # Hugging Face .eval_results: one folder per checkpoint, one entry per task, naming its step and digest
    from huggingface_hub import parse_eval_result_entries

    for step in (30, 80):
        (path,) = (out / "hf" / f"step_{step}" / ".eval_results").glob("*.yaml")
        (entry,) = parse_eval_result_entries(yaml.safe_load(path.read_text()))
        assert (entry.dataset_id, entry.task_id) == ("stdlib_next_line", "stdlib_next_line")
        assert f"checkpoint step {step}, weights_sha256 {digests[step]}" in entry.notes
