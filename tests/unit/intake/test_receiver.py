"""The notification receiver over a real ipc socket: no single frame stops it, every frame is
handed on or counted, and it never waits on (or grows) the main loop's queue.

The peers are real ZeroMQ PUSH sockets and raw AF_UNIX sockets in a private temp dir. Waits
are liveness bounds (generous, only fail when something never happens), never speed checks.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import socket
import time

import pytest
import zmq

from evald.contracts import wire
from evald.intake.receiver import BAD_MESSAGE, ZMQ, Receiver

WAIT_S = 30.0


def wait_until(predicate, what: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened within {timeout:.0f} s: {what}")
        time.sleep(0.01)


def next_item(out: queue.Queue, what: str) -> tuple[str, object]:
    try:
        return out.get(timeout=WAIT_S)
    except queue.Empty:
        raise AssertionError(f"nothing arrived within {WAIT_S:.0f} s: {what}") from None


@pytest.fixture
def endpoint(socket_dir):
    return f"ipc://{socket_dir}/n.sock"


@pytest.fixture
def receivers(endpoint):
    started: list[Receiver] = []

    def start(out: queue.Queue | None = None, **kwargs) -> tuple[Receiver, queue.Queue]:
        out = queue.Queue() if out is None else out
        receiver = Receiver(endpoint, out, **kwargs)
        receiver.start()
        started.append(receiver)
        return receiver, out

    yield start
    for receiver in started:
        receiver.close()


@pytest.fixture
def push(endpoint):
    context = zmq.Context()
    sock = context.socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 100_000)
    sock.connect(endpoint)
    yield sock
    sock.close(linger=0)
    context.term()


def committed(step: int = 1) -> wire.CheckpointCommitted:
    return wire.CheckpointCommitted(run_id="r", ckpt_dir="/c", step=step, path=f"step_{step:09d}",
                                    commit_time=1.0, sent_at=2.0)


def metrics_frame(step: int) -> bytes:
    return wire.TrainMetrics(run_id="r", records=({"step": step, "wall_time": 1.0,
                                                   "scalars": {"loss": 0.5}},)).encode()


def raw(**fields) -> bytes:
    return json.dumps({"v": 1, **fields}).encode()


def committed_with(**overrides) -> bytes:
    return raw(**{**committed().to_dict(), **overrides})


HOSTILE = {  # frame -> the reason it is counted under; each of these once killed evald or its receiver
    "step_10e30": (raw(type="train_metrics", run_id="r",
                       records=[{"step": 10**30, "wall_time": 1.0, "scalars": {}}]), "train_metrics.records"),
    "step_infinity": (b'{"v":1,"type":"train_metrics","run_id":"r","records":[{"step":Infinity,"wall_time":1,'
                      b'"scalars":{}}]}', "train_metrics.records"),
    "path_nul": (committed_with(path="a\u0000.ckpt"), "checkpoint_committed.path"),
    "path_surrogate": (committed_with(path="\ud800x.ckpt"), "checkpoint_committed.path"),
    "path_300": (committed_with(path="x" * 300 + ".ckpt"), "checkpoint_committed.path"),
    "path_step_300": (committed_with(path="step_" + "9" * 300), "checkpoint_committed.path"),
    "forged_step": (committed_with(step=10**30), "checkpoint_committed.step"),
    "nested_20000": (b"[" * 20000, "too_deep"),
    "oversize_2MiB": (b" " * (2 << 20), "oversize"),
    "type_list": (b'{"v":1,"type":[]}', "unknown_type"),
    "digits_5000": (b'{"v":1,"type":"run_finished","run_id":"r","ckpt_dir":"/c","final_step":' + b"9" * 5000
                    + b"}", "run_finished.final_step"),
    "garbage": (os.urandom(512), "not_json"),
    "empty": (b"", "not_json"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_frame_is_counted_and_the_next_message_still_arrives(receivers, push, name):
    frame, reason = HOSTILE[name]
    receiver, out = receivers()
    push.send(frame)
    push.send(committed(7).encode())
    first = next_item(out, f"a notice for the {name} frame")
    assert first[0] == BAD_MESSAGE, f"{name} was accepted as {first[1]!r}"
    assert next_item(out, "the valid message sent after it") == (ZMQ, committed(7))
    assert receiver.is_alive()
    assert receiver.rejected_by_reason == {reason: 1} and receiver.rejected == 1
    assert receiver.received == 1 and receiver.errors == 0


def test_a_multipart_message_is_one_bad_message(receivers, push):
    receiver, out = receivers()
    push.send_multipart([committed(1).encode(), b"second part"])
    push.send(committed(2).encode())
    assert next_item(out, "the multipart notice") == (BAD_MESSAGE, "a message of 2 frames; a notification is one frame")
    assert next_item(out, "the message after it") == (ZMQ, committed(2))
    assert receiver.rejected_by_reason == {"multipart": 1}


def test_a_frame_over_the_hard_limit_costs_its_connection_which_is_counted(receivers, push, caplog):
    caplog.set_level(logging.INFO, logger="evald.receiver")
    receiver, out = receivers(hard_limit_bytes=2 << 20)
    push.send(committed(1).encode())
    assert next_item(out, "the first message") == (ZMQ, committed(1))
    push.send(b" " * (3 << 20))
    wait_until(lambda: receiver.peer_events["disconnected"] >= 1, "libzmq dropping the peer (monitor event)")
    push.send(committed(2).encode())  # the PUSH socket reconnects by itself
    assert next_item(out, "a message after the reconnection") == (ZMQ, committed(2))
    assert receiver.peer_events["accepted"] >= 2 and receiver.is_alive()
    assert any("connected again" in r.getMessage() and str(2 << 20) in r.getMessage()
               for r in caplog.records if r.levelno == logging.WARNING)  # dropped: warned, not taken for a leaving trainer


# A ZMTP 3.0 greeting (signature, version 3.0) proposing a mechanism libzmq does not know.
BOGUS_GREETING = b"\xff" + b"\x00" * 8 + b"\x7f" + b"\x03\x00" + b"BOGUS".ljust(20, b"\x00") + b"\x00" * 32


def test_raw_bytes_never_become_messages_and_failed_handshakes_are_counted(receivers, push, socket_dir):
    receiver, out = receivers()
    with socket.socket(socket.AF_UNIX) as unversioned, socket.socket(socket.AF_UNIX) as bogus:
        unversioned.connect(f"{socket_dir}/n.sock")
        unversioned.sendall(b"\x05" + os.urandom(4096))  # ZMTP 1.0 framing: refused because ZAP is on
        bogus.connect(f"{socket_dir}/n.sock")
        bogus.sendall(BOGUS_GREETING)
        wait_until(lambda: receiver.peer_events["refused"] >= 1, "the bogus handshake refused (monitor event)")
    wait_until(lambda: receiver.peer_events["disconnected"] >= 2, "both raw peers disconnected")
    push.send(committed(3).encode())
    assert next_item(out, "a valid message after the raw peers") == (ZMQ, committed(3))
    assert out.empty() and receiver.rejected == 0  # nothing of the raw bytes reached decode


def test_a_full_queue_drops_and_counts_instead_of_growing_or_blocking(receivers, push):
    out: queue.Queue = queue.Queue(maxsize=16)  # nobody consumes it: evald's main loop is busy
    receiver, _ = receivers(out)
    for step in range(200):
        push.send(metrics_frame(step))
    for step in (10, 20, 30):
        push.send(committed(step).encode())
    for _ in range(50):
        push.send(b"not json")
    wait_until(lambda: receiver.received + receiver.rejected == 253, "all 253 frames read")
    items = [out.get_nowait() for _ in range(out.qsize())]
    kinds = [item[1].TYPE for item in items if item[0] == ZMQ]
    # train_metrics and bad notices stop at 3/4 full; the rest is kept for doorbells that matter
    assert kinds == ["train_metrics"] * 12 + ["checkpoint_committed"] * 3
    assert [item[1] for item in items[-3:]] == [committed(10), committed(20), committed(30)]
    assert receiver.dropped_by_type == {"train_metrics": 188, "bad_message": 50}
    assert receiver.rejected_by_reason == {"not_json": 50} and receiver.is_alive()


def test_training_scalars_take_at_most_their_room_of_a_large_queue(receivers, push):
    """A flood of train_metrics keeps at most ``low_priority_room`` of them queued, however large the
    queue: what the flood leaves behind is that backlog, the allocator's high-water mark (issue 12)."""
    out: queue.Queue = queue.Queue(maxsize=10_000)
    receiver, _ = receivers(out, low_priority_room=5)
    for step in range(40):
        push.send(metrics_frame(step))
    push.send(committed(10).encode())
    wait_until(lambda: receiver.received == 41, "all 41 messages read")
    kinds = [out.get_nowait()[1].TYPE for _ in range(out.qsize())]
    assert kinds == ["train_metrics"] * 5 + ["checkpoint_committed"]
    assert receiver.dropped_by_type == {"train_metrics": 35}


def test_when_even_doorbells_do_not_fit_they_are_dropped_and_counted(receivers, push):
    out: queue.Queue = queue.Queue(maxsize=2)
    receiver, _ = receivers(out, doorbell_reserve=0)
    for step in range(1, 6):
        push.send(committed(step).encode())
    wait_until(lambda: receiver.received == 5, "five messages read")
    assert out.qsize() == 2 and receiver.dropped_by_type == {"checkpoint_committed": 3}


class FailingOnce(queue.Queue):
    """A real queue whose first put raises, standing in for any unexpected fault in the loop."""

    def put(self, item, block=True, timeout=None):
        if not getattr(self, "failed", False):
            self.failed = True
            raise RuntimeError("injected fault")
        super().put(item, block, timeout)


def test_an_unexpected_exception_is_logged_and_the_loop_goes_on(receivers, push, caplog):
    out = FailingOnce()
    receiver, _ = receivers(out)
    push.send(committed(1).encode())
    wait_until(lambda: receiver.errors == 1, "the injected fault")
    push.send(committed(2).encode())
    assert next_item(out, "a message after the fault") == (ZMQ, committed(2))
    assert receiver.is_alive()
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "continuing" in record.getMessage() and "injected fault" in record.exc_text


def test_warnings_are_rate_limited_per_reason_with_the_count_since_the_last(receivers, push, caplog):
    caplog.set_level(logging.INFO, logger="evald.receiver")
    now = [1000.0]
    receiver, out = receivers(log_interval_s=10.0, clock=lambda: now[0])
    for _ in range(5):
        push.send(b"not json")
    for _ in range(3):
        push.send(b"[" * 100)
    wait_until(lambda: receiver.rejected == 8, "eight bad frames read")

    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]

    assert len(warnings()) == 2
    assert "(not_json; 1 so far)" in warnings()[0] and "(too_deep; 1 so far)" in warnings()[1]
    now[0] += 10.0
    push.send(b"still not json")
    wait_until(lambda: receiver.rejected == 9, "the ninth bad frame read")
    assert len(warnings()) == 3
    assert "(not_json; 6 so far)" in warnings()[2] and "[4 more since the last report]" in warnings()[2]
    receiver.close()  # what was never reported individually is summed up at close
    assert any("2 more bad:too_deep" in r.getMessage() for r in caplog.records if r.levelno == logging.INFO)
