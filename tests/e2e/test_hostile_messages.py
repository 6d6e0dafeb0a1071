"""Issue 12, part 5: forged messages cannot steer the run, and the trainer obeys only its evald.

On commit 1337672 a forged first message attached evald to another directory, a commit of step
10**30 made it publish an absurd stop step, a run_finished for another run made it exit 0 (for
good: the end was persisted), a run_announced with no factories left the checkpoints queued, and
a process of another user stopped training at step 1 through a TCP control endpoint.

Here the messages come over evald's own private ipc socket, the most trusted channel there is
(tests/e2e/test_hostile_code.py covers TCP and other users): even from there a message is a doorbell.
The trainer side is the real ``ControlSubscriber``/``StopAgreement`` with a publisher that is a
process of another user (uid 65534).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time

import pytest

from evald.contracts import layout, wire
from evald.sinks.counters import MessageCounts, read_counts
from tests import faults, hostile
from tests.harness import run_dir, scalar_points, wait_for
from trainer_hooks.stop_agreement import ControlSubscriber, StopAgreement

MAX = 2**63 - 1


def test_forged_messages_neither_retarget_nor_end_nor_stall_the_run_nor_push_the_stop(tmp_path, endpoints, procs):
    ckpt = tmp_path / "ckpt"
    faults.announce(ckpt, run_id="real")
    bait = hostile.Bait.make(tmp_path)
    every = 10
    layout.write_run_file(ckpt, wire.RunAnnounced(run_id="real", ckpt_dir=str(ckpt), every_n_steps=every,
                                                  model_factory=faults.MODEL_FACTORY,
                                                  data_factory=faults.DATA_FACTORY).encode().decode())
    evald = faults.start(tmp_path, ckpt, "--stopping-threshold", "100", "--lag-policy", "all", env=endpoints,
                         zmq=True)  # the first evaluation decides to stop: where to is the question
    procs.append(evald)
    wait_for(lambda: "evaluation network ready" in evald.output(), 180, "the network built")
    forged = [
        wire.RunAnnounced(run_id="real", ckpt_dir=str(ckpt)),                      # no factories
        wire.RunAnnounced(run_id="bait", ckpt_dir=str(bait.root), model_factory=bait.system_factory()),
        wire.CheckpointCommitted(run_id="real", ckpt_dir=str(bait.root), step=1, path=layout.step_dir_name(1),
                                 commit_time=time.time()),                        # another directory
        wire.CheckpointCommitted(run_id="real", ckpt_dir=str(ckpt), step=MAX, path=layout.step_dir_name(10),
                                 commit_time=time.time()),                        # step 2**63-1
        wire.TrainMetrics(run_id="real", records=({"step": MAX, "wall_time": time.time(),
                                                   "scalars": {"loss": 1.0}},)),  # training "at" 2**63-1
        wire.RunFinished(run_id="other", ckpt_dir=str(ckpt), final_step=10),      # another run's end
        wire.RunFinished(run_id="real", ckpt_dir=str(ckpt), final_step=10),       # no RUN_END.json behind it
        wire.RunFinished(run_id="real", ckpt_dir=str(bait.root), final_step=1),
    ]
    genuine = wire.TrainMetrics(run_id="real", records=({"step": 15, "wall_time": time.time(),
                                                         "scalars": {"loss": 3.0}},))
    faults.push(endpoints["EVALD_ENDPOINT"], [*forged, genuine])
    faults.commit(ckpt, 10, run_id="real")
    faults.commit(ckpt, 20, run_id="real")
    faults.push(endpoints["EVALD_ENDPOINT"], [faults.committed_notice(ckpt, s, "real") for s in (10, 20)])
    wait_for(lambda: [r["state"] for r in faults.ledger_rows(ckpt)] == ["evaluated", "evaluated"], 180,
             "both checkpoints evaluated (not stalled by the announcement without factories)")

    subscriber = ControlSubscriber(endpoints["EVALD_CONTROL_ENDPOINT"], "real")
    try:
        state = wait_for(lambda: subscriber.poll(), 30, "the control state")
    finally:
        subscriber.close()
    # the stop step is counted from the checkpoints on disk (20) plus at most two intervals, plus the margin
    assert state.stop_at_step is not None and state.stop_at_step <= 20 + 2 * every + every, state
    sent = len(forged) + 1 + 2
    wait_for(lambda: (read_counts(run_dir(ckpt)) or MessageCounts()).handled >= sent, 60,
             f"evald's loop handled all {sent} messages (counters.json)")
    assert _still_running(evald), "a forged run_finished ended the run"
    assert read_counts(run_dir(ckpt)).ignored >= 3  # another directory (twice) and another run
    assert not (run_dir(ckpt) / "summary.json").exists()
    assert bait.untouched()
    assert "ignored a" in evald.output()
    # the forged record at 2**63-1 did not silence the genuine one after it
    assert [(s, v) for s, _, v in scalar_points(run_dir(ckpt), "train/loss")] == [(15, 3.0)]
    evald.signal(signal.SIGTERM)
    assert evald.wait(60) == 0
    again = faults.start(tmp_path, ckpt, env=endpoints, zmq=True, name="evald2")  # nothing forged was kept
    procs.append(again)
    wait_for(lambda: "serving" in again.output(), 120, "the restart serving")
    faults.push(endpoints["EVALD_ENDPOINT"], [faults.committed_notice(ckpt, 20, "real")])
    # the first evald's counters.json said 11; the restart's own counts start again at 0
    wait_for(lambda: (read_counts(run_dir(ckpt)) or MessageCounts()).handled == 1, 60, "the restart's loop turning")
    assert _still_running(again) and "run real finished" not in again.output()
    again.signal(signal.SIGTERM)
    assert again.wait(60) == 0


def _still_running(proc, turn_s: float = 1.0) -> bool:
    """Still running a loop turn after the one that handled the messages (the turn that would have ended it)."""
    try:
        proc.popen.wait(timeout=turn_s)
    except subprocess.TimeoutExpired:
        return True
    return False


def _publish_stop_as_other_user(endpoint: str, run_id: str, seconds: float) -> int:
    def publish() -> None:
        import zmq

        context = zmq.Context()
        sock = context.socket(zmq.PUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(endpoint)
        deadline = time.time() + seconds
        while time.time() < deadline:
            sock.send(wire.ControlState(run_id=run_id, seq=1, stop_at_step=1, reason="forged").encode())
            time.sleep(0.05)
        sock.close()
        context.term()
    return hostile.as_other_user(publish, timeout=seconds + 30)


def _stopped_by_forgery(endpoint: str, monkeypatch, allow_plaintext: bool) -> bool:
    """A trainer (the real subscriber and agreement) polls for as long as another user publishes a stop (4 s
    from its bind): subscribed before the publisher starts and stepping until it has ended, however slowly
    either of them runs, so that "not stopped" means no stop was accepted, not that none had arrived yet."""
    import threading

    if allow_plaintext:
        monkeypatch.setenv("EVALD_ALLOW_PLAINTEXT", "1")
    else:
        monkeypatch.delenv("EVALD_ALLOW_PLAINTEXT", raising=False)
    result: dict[str, int] = {}
    publisher = threading.Thread(target=lambda: result.setdefault("code", _publish_stop_as_other_user(
        endpoint, "victim", 4.0)))
    agreement = StopAgreement(rank=0, world_size=1, subscriber=ControlSubscriber(endpoint, "victim"))
    stopped = False
    try:
        publisher.start()
        step = 0
        while publisher.is_alive():
            step += 1
            if agreement.should_stop(step):
                stopped = True
                break
            time.sleep(0.01)
    finally:
        agreement.close()
        publisher.join()
    assert result.get("code") == 0
    return stopped


@pytest.mark.skipif(not hostile.is_root(), reason="a process of another user needs root here")
def test_another_users_publisher_cannot_stop_training_over_plaintext_tcp(monkeypatch, caplog):
    endpoint = f"tcp://127.0.0.1:{hostile.free_tcp_port()}"
    assert not _stopped_by_forgery(endpoint, monkeypatch, allow_plaintext=False)
    assert "not subscribing to evald control at tcp://" in caplog.text and "refusing plaintext" in caplog.text
    # explicitly allowed plaintext is what docs/security.md says it is: unauthenticated
    assert _stopped_by_forgery(f"tcp://127.0.0.1:{hostile.free_tcp_port()}", monkeypatch, allow_plaintext=True)


@pytest.mark.skipif(not hostile.is_root(), reason="a process of another user needs root here")
def test_another_users_socket_directory_cannot_stop_training(monkeypatch, caplog):
    squatted = tempfile.mkdtemp(prefix="evsq")  # like /tmp/evald-<uid> made first by someone else
    try:
        os.chown(squatted, hostile.OTHER_UID, hostile.OTHER_UID)
        os.chmod(squatted, 0o777)
        endpoint = f"ipc://{squatted}/control.sock"
        assert not _stopped_by_forgery(endpoint, monkeypatch, allow_plaintext=False)
    finally:
        shutil.rmtree(squatted, ignore_errors=True)
    assert f"socket directory {squatted} is not private to uid" in caplog.text
