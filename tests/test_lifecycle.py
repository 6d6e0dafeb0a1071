"""Issue 3, lifecycle: SIGTERM, a second signal, the run-finished message, --serve-forever.

Real ``python -m evald`` processes; the run-finished message is a real ``wire.RunFinished``
sent over a ZeroMQ PUSH socket to evald's endpoint.
"""

from __future__ import annotations

import json
import signal
import time

from evald.contracts import layout, wire
from tests import faults
from tests.harness import raw_scalar_steps, scalar_points, wait_for

# The whole validation set in batches of 8: an evaluation lasts seconds, so a signal lands in one.
SLOW = ("--subset-size", "100000", "--batch-size", "8")


def _state(ckpt, step):
    return faults.ledger_by_key(ckpt).get(layout.step_dir_name(step), {}).get("state")


def _steps(ckpt, state):
    return sorted(r["step"] for r in faults.ledger_rows(ckpt) if r["state"] == state)


def test_sigterm_finishes_the_current_evaluation_and_exits_0(tmp_path, procs):
    ckpt = tmp_path / "ckpt"
    faults.announce(ckpt)
    for step in (10, 20, 30):
        faults.commit(ckpt, step)
    evald = faults.start(tmp_path, ckpt, "--lag-policy", "all", *SLOW)
    procs.append(evald)
    wait_for(lambda: _state(ckpt, 20) == "evaluating", 240, "step 20 being evaluated", interval=0.05)
    evald.signal(signal.SIGTERM)
    signalled = time.time()
    assert evald.wait(120) == 0, evald.output()[-3000:]
    log = evald.output()
    assert "signal received: finishing this evaluation, then exiting" in log and "evald stopped" in log
    assert "Traceback" not in log
    # the evaluation under way was finished and recorded; the next one was not started
    assert _steps(ckpt, "evaluated") == [10, 20] and _steps(ckpt, "queued") == [30]
    row = faults.ledger_by_key(ckpt)[layout.step_dir_name(20)]
    assert row["finished_at"] > signalled
    # every point written before the signal is readable, by both readers, once
    assert raw_scalar_steps(ckpt / "evald", "eval/loss") == [10, 20]
    assert [s for s, _, _ in scalar_points(ckpt / "evald", "eval/loss")] == [10, 20]
    # the writer was closed: its file ends on a whole, CRC-checked record
    [events] = list((ckpt / "evald").glob("events.out.tfevents.*"))
    records, trailing = faults.event_file_records(events)
    assert records >= 3 and trailing == 0


def test_second_signal_abandons_the_evaluation_and_a_restart_redoes_it(tmp_path, procs):
    ckpt = tmp_path / "ckpt"
    faults.announce(ckpt)
    faults.commit(ckpt, 10)
    evald = faults.start(tmp_path, ckpt, "--lag-policy", "all", *SLOW)
    procs.append(evald)
    wait_for(lambda: _state(ckpt, 10) == "evaluating", 240, "step 10 being evaluated", interval=0.05)
    evald.signal(signal.SIGTERM)
    time.sleep(0.3)
    evald.signal(signal.SIGTERM)
    forced = time.time()
    assert evald.wait(60) == 1, evald.output()[-3000:]
    exit_s = time.time() - forced
    log = evald.output()
    assert "forced exit: the evaluation under way was abandoned" in log and "evald stopped" in log
    row = faults.ledger_by_key(ckpt)[layout.step_dir_name(10)]
    assert row["state"] == "queued" and "interrupted by a forced shutdown" in row["reason"], row
    assert raw_scalar_steps(ckpt / "evald", "eval/loss") == []
    assert exit_s < 10, exit_s

    again = faults.start(tmp_path, ckpt, "--lag-policy", "all", "--idle-exit-s", "2", name="evald2")
    procs.append(again)
    assert again.wait(180) == 0, again.output()[-3000:]
    assert _steps(ckpt, "evaluated") == [10]
    assert faults.ledger_by_key(ckpt)[layout.step_dir_name(10)]["attempts"] == 2
    assert raw_scalar_steps(ckpt / "evald", "eval/loss") == [10]


def _finish_run(tmp_path, endpoints, procs, *extra):
    """evald with no --ckpt-dir, told by a real RunFinished message where the run is and that it ended."""
    ckpt = tmp_path / "ckpt"
    faults.announce(ckpt)
    for step in (10, 20):
        faults.commit(ckpt, step)
    evald = faults.start(tmp_path, None, *extra, env=endpoints, zmq=True)
    procs.append(evald)
    wait_for(lambda: "listening for notifications" in evald.output(), 120, "evald listening")
    faults.push(endpoints["EVALD_ENDPOINT"], [wire.RunFinished(run_id="faults", ckpt_dir=str(ckpt), final_step=20)])
    return ckpt, evald


def test_run_finished_message_evaluates_the_final_checkpoint_and_exits_0(tmp_path, endpoints, procs):
    ckpt, evald = _finish_run(tmp_path, endpoints, procs)  # default lag policy: latest
    assert evald.wait(180) == 0, evald.output()[-3000:]
    assert _steps(ckpt, "evaluated") == [20] and _steps(ckpt, "skipped") == [10]
    summary = json.loads((ckpt / "evald" / "summary.json").read_text())
    assert summary["final_step"] == 20 and summary["checkpoints"] == {"evaluated": 1, "skipped": 1}
    assert [s for s, tag, _ in faults.tb_texts(ckpt / "evald") if tag == "evald/summary"] == [20]
    assert raw_scalar_steps(ckpt / "evald", "eval/loss") == [20]
    assert "run faults finished at step 20" in evald.output()


def test_serve_forever_keeps_running_after_run_finished_until_sigterm(tmp_path, endpoints, procs):
    ckpt, evald = _finish_run(tmp_path, endpoints, procs, "--serve-forever")
    wait_for(lambda: (ckpt / "evald" / "summary.json").exists(), 180, "the run summary")
    time.sleep(3)
    assert evald.popen.poll() is None, evald.output()[-3000:]
    evald.signal(signal.SIGTERM)
    assert evald.wait(60) == 0, evald.output()[-3000:]
    assert _steps(ckpt, "evaluated") == [20]
    # the run was summarised once, not on every turn of the loop while serving on
    assert [s for s, tag, _ in faults.tb_texts(ckpt / "evald") if tag == "evald/summary"] == [20]
    assert evald.output().count("run complete:") == 1
