"""Benchmark suites in a real evald: SIGKILL during a suite, a suite added and backfilled, a suite
changed (new cells, old ones superseded), and a changed validation configuration re-evaluating
(issue 18.2) — real processes, the real ledger, TensorBoard's own reader, the per-sample files."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess

import pytest

from examples.tiny_lm.benchmarks import write_benchmarks
from tests import faults
from tests.harness import PYTHON, REPO, base_env, raw_scalar_steps, run_dir, wait_for


def _cells(ckpt):
    if not faults.ledger_path(ckpt).exists():
        return []
    db = sqlite3.connect(faults.ledger_path(ckpt), timeout=30)
    try:
        return db.execute("SELECT step, evaluation, identity, state, superseded_by FROM cells ORDER BY id").fetchall()
    except sqlite3.OperationalError:  # evald has not created the schema yet
        return []
    finally:
        db.close()


def _toml(path, include, suites):
    text = 'tokenizer_factory = "examples.tiny_lm.benchmarks:build_tokenizer"\n'
    for name, body in suites.items():
        text += f"[suites.{name}]\ninclude_path = [{json.dumps(include)}]\n{body}\n"
    path.write_text(text)
    return str(path)


@pytest.mark.smoke
def test_sigkill_during_a_suite_then_backfill_and_a_changed_suite(tmp_path, procs):
    include = write_benchmarks(tmp_path / "bench", next_line_count=60, bpb_docs_per_set=2)
    ckpt = tmp_path / "ckpt"
    faults.announce(ckpt)
    for step in (10, 20):
        faults.commit(ckpt, step)
    mc = 'tasks = ["stdlib_next_line"]\nlimit = 48\nbatch_size = 4'
    config = _toml(tmp_path / "a.toml", include, {"mc": mc})
    env = {"HF_HOME": str(tmp_path / "hf")}
    first = faults.start(tmp_path, ckpt, "--config", config, "--lag-policy", "all", env=env)
    procs.append(first)
    wait_for(lambda: any(c[3] == "evaluating" for c in _cells(ckpt)), 300, "a suite cell being evaluated")
    first.signal(signal.SIGKILL)
    first.wait(30)

    again = faults.start(tmp_path, ckpt, "--config", config, "--lag-policy", "all", "--idle-exit-s", "3", env=env,
                         name="evald-again")
    procs.append(again)
    assert again.wait(600) == 0, again.output()[-3000:]
    run = run_dir(ckpt)
    current = [(s, e, st) for s, e, _, st, by in _cells(ckpt) if by is None]
    assert sorted(current) == [(10, "suite:mc", "evaluated"), (20, "suite:mc", "evaluated")]
    assert raw_scalar_steps(run, "eval/mc/stdlib_next_line/acc") == [10, 20]           # one point per step
    assert raw_scalar_steps(run, "eval/mc/stdlib_next_line/acc_stderr") == [10, 20]
    assert len(list((run / "samples" / "mc" / "stdlib_next_line").glob("step_*.jsonl.gz"))) == 2

    # a suite added: backfill evaluates only its missing cells, at each checkpoint's own step
    config = _toml(tmp_path / "b.toml", include, {"mc": mc, "bpb": 'tasks = ["bpb_email", "bpb_http"]'})
    out = subprocess.run([PYTHON, "-m", "evald", "backfill", "--suite", "bpb", "--ckpt-dir", str(ckpt), "--",
                          "--config", config, "--endpoint", "none", "--subset-size", "32", "--batch-size", "16",
                          "--generation", '{"prompts": 0}', "--idle-exit-s", "3"], cwd=REPO, env=base_env(env),
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert "suite bpb on 2 retained checkpoint(s): 10, 20" in out.stdout
    assert raw_scalar_steps(run, "eval/bpb/bpb_email/bits_per_byte") == [10, 20]
    assert raw_scalar_steps(run, "eval/mc/stdlib_next_line/acc") == [10, 20]             # mc not evaluated again

    # the suite changed (another subset size): new cells; the old ones superseded, still readable
    config = _toml(tmp_path / "c.toml", include, {"mc": mc.replace("limit = 48", "limit = 40"),
                                                   "bpb": 'tasks = ["bpb_email", "bpb_http"]'})
    third = faults.start(tmp_path, ckpt, "--config", config, "--lag-policy", "all", "--idle-exit-s", "3", env=env,
                         name="evald-third")
    procs.append(third)
    assert third.wait(600) == 0, third.output()[-3000:]
    cells = _cells(ckpt)
    mc_cells = [c for c in cells if c[1] == "suite:mc"]
    old = [c for c in mc_cells if c[4] is not None]
    new = [c for c in mc_cells if c[4] is None]
    assert sorted(c[0] for c in old) == [10, 20] and {c[4] for c in old} == {new[0][2]}
    assert sorted((c[0], c[3]) for c in new) == [(10, "evaluated"), (20, "evaluated")]
    assert raw_scalar_steps(run, "eval/bpb/bpb_email/bits_per_byte") == [10, 20]        # bpb untouched
    status = subprocess.run([PYTHON, "-m", "evald", "status", "--ckpt-dir", str(ckpt), "--json"], cwd=REPO,
                            env=base_env(env), capture_output=True, text=True, timeout=60)
    info = json.loads(status.stdout)
    assert info["suites"]["mc"]["cells"] == {"evaluated": 2} and info["suites"]["bpb"]["cells"] == {"evaluated": 2}


def test_a_changed_configuration_evaluates_again_and_retry_re_evaluates(tmp_path, procs):
    """Issue 18.2 and 18.3: the fixed configuration is a new evaluation; the old result is kept, marked
    superseded, not current; `evald retry --step N` re-evaluates an evaluated step."""
    ckpt = tmp_path / "ckpt"
    faults.announce(ckpt)
    for step in (10, 20):
        faults.commit(ckpt, step)
    first = faults.start(tmp_path, ckpt, "--subset-size", "16", "--lag-policy", "all", "--idle-exit-s", "2")
    procs.append(first)
    assert first.wait(240) == 0, first.output()[-3000:]
    before = {r["step"]: json.loads(r["metrics"])["eval/loss"] for r in faults.ledger_rows(ckpt)}

    second = faults.start(tmp_path, ckpt, "--subset-size", "32", "--lag-policy", "all", "--idle-exit-s", "2",
                          name="evald-second")
    procs.append(second)
    assert second.wait(240) == 0, second.output()[-3000:]
    rows = faults.ledger_rows(ckpt)
    assert [r["state"] for r in rows] == ["evaluated", "evaluated"]
    after = {r["step"]: json.loads(r["metrics"])["eval/loss"] for r in rows}
    assert after != before
    old = [c for c in _cells(ckpt) if c[1] == "validation"]
    assert sorted(c[0] for c in old) == [10, 20] and all(c[3] == "evaluated" and c[4] for c in old)
    best = json.loads((run_dir(ckpt) / "best.json").read_text())
    assert best["value"] == min(after.values())                                      # the current one

    out = subprocess.run([PYTHON, "-m", "evald", "retry", "--step", "20", "--ckpt-dir", str(ckpt)], cwd=REPO,
                         env=base_env({}), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert [r["state"] for r in faults.ledger_rows(ckpt)] == ["evaluated", "queued"]
    third = faults.start(tmp_path, ckpt, "--subset-size", "32", "--lag-policy", "all", "--idle-exit-s", "2",
                         name="evald-third")
    procs.append(third)
    assert third.wait(240) == 0, third.output()[-3000:]
    assert [r["state"] for r in faults.ledger_rows(ckpt)] == ["evaluated", "evaluated"]
    assert len([c for c in _cells(ckpt) if c[0] == 20 and c[1] == "validation"]) == 2
