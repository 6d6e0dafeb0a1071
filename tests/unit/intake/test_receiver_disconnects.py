"""Issue 18 item 13: a trainer's normal disconnect is logged as such (INFO), not as a fault.

libzmq reports every closed connection alike (EVENT_DISCONNECTED): a trainer closing its
notifier, a peer it refused at the handshake, a peer it dropped for a frame over the hard
limit. The receiver tells them apart by what came with them: a refused handshake is warned
once (its disconnect adds nothing), a peer that comes straight back was dropped (warned),
anything else is a peer that left (INFO). Real ZeroMQ sockets over ipc; real raw sockets."""

from __future__ import annotations

import logging
import queue
import socket
import time

import pytest
import zmq

from evald.contracts import wire
from evald.intake.receiver import Receiver

FAULT_WORDS = ("frame over", "not ZeroMQ", "failed")
# A ZMTP 3.0 greeting (signature, version 3.0) proposing a mechanism libzmq does not know.
BOGUS_GREETING = b"\xff" + b"\x00" * 8 + b"\x7f" + b"\x03\x00" + b"BOGUS".ljust(20, b"\x00") + b"\x00" * 32


def _wait(predicate, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened within {timeout:.0f} s: {what}")
        time.sleep(0.01)


@pytest.fixture
def receiver(socket_dir, caplog):
    caplog.set_level(logging.DEBUG, logger="evald.receiver")
    out: queue.Queue = queue.Queue()
    started = Receiver(f"ipc://{socket_dir}/n.sock", out, hard_limit_bytes=1 << 20)
    started.start()
    yield started, out
    started.close()


def _push(endpoint: str):
    context = zmq.Context()
    sock = context.socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 1000)
    sock.connect(endpoint)
    return context, sock


def _committed(step: int) -> bytes:
    return wire.CheckpointCommitted(run_id="r", ckpt_dir="/c", step=step, path=f"step_{step:09d}",
                                    commit_time=1.0).encode()


def _lines(caplog, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "evald.receiver" and r.levelno == level]


def test_a_trainer_that_sends_and_closes_is_logged_as_leaving_not_as_a_fault(receiver, caplog):
    rec, out = receiver
    context, sock = _push(rec.endpoint)
    sock.send(_committed(10))
    out.get(timeout=30)
    sock.close()  # what trainer_hooks' notifier does at train_end
    context.term()
    _wait(lambda: rec.peer_events["disconnected"] >= 1, "the disconnect (monitor event)")
    _wait(lambda: [r for r in caplog.records if r.name == "evald.receiver"], "a line about it")
    left = [line for line in _lines(caplog, logging.INFO) if "disconnect" in line or "left" in line]
    assert left and not any(word in line for line in left for word in FAULT_WORDS), left
    assert _lines(caplog, logging.WARNING) == []


def test_a_refused_handshake_is_warned_once_and_its_disconnect_adds_no_line(receiver, caplog, socket_dir):
    rec, _ = receiver
    with socket.socket(socket.AF_UNIX) as raw:
        raw.connect(f"{socket_dir}/n.sock")
        raw.sendall(BOGUS_GREETING)
        _wait(lambda: rec.peer_events["refused"] >= 1, "the refused handshake (monitor event)")
    _wait(lambda: rec.peer_events["disconnected"] >= 1, "its disconnect (monitor event)")
    assert [line for line in _lines(caplog, logging.WARNING) if "refused a peer" in line]
    assert not [line for line in _lines(caplog, logging.INFO) if "disconnect" in line or "left" in line]


def test_bytes_that_are_not_zeromq_are_warned_when_their_connection_closes(receiver, caplog, socket_dir):
    rec, _ = receiver
    with socket.socket(socket.AF_UNIX) as raw:
        raw.connect(f"{socket_dir}/n.sock")
        raw.sendall(b"\x05" + b"\x00" * 64)  # ZMTP 1.0 framing: libzmq closes it without a handshake event
    _wait(lambda: rec.peer_events["disconnected"] >= 1, "its disconnect (monitor event)")
    _wait(lambda: _lines(caplog, logging.WARNING), "a warning")
    assert any("not ZeroMQ" in line for line in _lines(caplog, logging.WARNING))
    assert not [line for line in _lines(caplog, logging.INFO) if "disconnect" in line or "left" in line]


def test_a_peer_dropped_for_a_frame_over_the_hard_limit_is_warned(receiver, caplog):
    rec, out = receiver
    context, sock = _push(rec.endpoint)
    sock.setsockopt(zmq.LINGER, 0)
    sock.send(_committed(1))
    out.get(timeout=30)
    sock.send(b" " * (2 << 20))  # libzmq drops the connection; the PUSH socket reconnects by itself
    _wait(lambda: rec.peer_events["accepted"] >= 2, "the reconnection (monitor event)")
    _wait(lambda: _lines(caplog, logging.WARNING), "a warning")
    assert any(str(1 << 20) in line and "over" in line for line in _lines(caplog, logging.WARNING))
    sock.close()
    context.term()
