"""Trainer on one host, evald on another: the wired channels over loopback TCP with CURVE.

Separate key directories stand in for the two hosts (``evald keys DIR`` makes one per host).
The components are evald's own (Receiver, ControlPublisher, the evald process) and the
trainer's own (Notifier, ControlSubscriber, EvaldHook, the training process). Every "nothing
arrived" is asserted after a positive control on the same socket went through and the bad
peer's handshake was seen to fail (ZAP refusal or the receiver's monitor), never on time alone.
"""

from __future__ import annotations

import logging
import os
import queue
import re
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

from evald.cli import keys as key_bundles
from evald.contracts import auth, wire
from evald.contracts.auth import SecurityConfig
from evald.sinks.control import ControlPublisher
from evald.intake.receiver import ZMQ, ZMQ_UNTRUSTED, Receiver
from tests.harness import committed_steps, hook_stats, start_evald, start_trainer, wait_for
from trainer_hooks.notifier import Notifier
from trainer_hooks.stop_agreement import ControlSubscriber

BOUND_S = 20.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Hosts:
    keys: dict
    evald: SecurityConfig         # evald host: its secret key and the allow-list
    trainer: SecurityConfig       # trainer host: its secret key and evald's public key
    intruder: SecurityConfig      # a key pair evald never allowed
    wrong_server: SecurityConfig  # the trainer's key, but another evald's public key
    no_key: SecurityConfig        # plaintext (allowed on the client side, so it really tries)
    rogue_evald: SecurityConfig   # a publisher with its own server key


@pytest.fixture
def hosts(tmp_path) -> Hosts:
    keys = key_bundles.create_key_bundles(tmp_path / "keys")
    _, intruder_secret = auth.generate_keypair(tmp_path / "intruder-host", "intruder")
    rogue_public, rogue_secret = auth.generate_keypair(tmp_path / "rogue-host", "rogue")
    trainer = dict(client_key=str(keys["client_key"]), server_public_key=str(keys["server_public_key"]))
    return Hosts(
        keys=keys,
        evald=SecurityConfig(server_key=str(keys["server_key"]), allowed_keys=(str(keys["allowed_keys"]),)),
        trainer=SecurityConfig(**trainer),
        intruder=SecurityConfig(client_key=str(intruder_secret), server_public_key=trainer["server_public_key"]),
        wrong_server=SecurityConfig(client_key=trainer["client_key"], server_public_key=str(rogue_public)),
        no_key=SecurityConfig(allow_plaintext=True),
        rogue_evald=SecurityConfig(server_key=str(rogue_secret), allowed_keys=(str(keys["allowed_keys"]),)),
    )


def committed(step: int) -> wire.CheckpointCommitted:
    return wire.CheckpointCommitted(run_id="r", ckpt_dir="/ckpt", step=step, path=f"step_{step}", commit_time=1.0)


def next_item(out: queue.Queue):
    return out.get(timeout=BOUND_S)


# --- evald's receiver and control publisher against the trainer's notifier and subscriber --------

@pytest.mark.parametrize("bad", ["intruder", "wrong_server", "no_key"])
def test_an_unauthorised_notifier_gets_nothing_accepted(hosts, bad):
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    out: queue.Queue = queue.Queue()
    receiver = Receiver(endpoint, out, security=hosts.evald)
    receiver.start()
    intruder = Notifier(endpoint, security=getattr(hosts, bad))
    trainer = Notifier(endpoint, security=hosts.trainer)
    try:
        for step in range(1, 4):
            intruder.send(committed(1000 + step))
        # its handshake fails: refused by the allow-list (ZAP) or by the receiver's monitor
        wait_for(lambda: receiver._auth.zap.refused + receiver.peer_events["refused"] > 0, BOUND_S,
                 "the unauthorised handshake to fail")
        trainer.send(committed(7))  # the positive control, after the intruder's attempts
        source, message = next_item(out)
        assert (source, message.step) == (ZMQ, 7)  # trusted: an allow-listed CURVE peer
        intruder.send(committed(1004))
        time.sleep(0.5)
        assert out.empty() and receiver.received == 1
    finally:
        intruder.close(0.1)
        trainer.close(0.1)
        receiver.close()


def test_control_reaches_only_the_allowed_trainer_and_only_from_its_evald(hosts, caplog):
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    publisher = ControlPublisher(endpoint, republish_s=0.05, security=hosts.evald)
    subscribers = {name: ControlSubscriber(endpoint, "r", security=getattr(hosts, name))
                   for name in ("trainer", "intruder", "wrong_server", "no_key")}
    try:
        publisher.update(wire.ControlState(run_id="r", seq=1, stop_at_step=5, reason="test"))
        seen = 0

        def heard() -> bool:
            nonlocal seen
            publisher.tick()
            if subscribers["trainer"].poll() is not None:
                seen += 1
            return seen >= 20  # twenty re-publications reached the trainer
        wait_for(heard, BOUND_S, "the allowed trainer to receive the control state", interval=0.05)
        assert publisher._auth.zap.refused > 0  # the intruder's key was turned away by the allow-list
        for name in ("intruder", "wrong_server", "no_key"):
            assert subscribers[name].poll() is None, name
    finally:
        for subscriber in subscribers.values():
            subscriber.close()
        publisher.close()


def test_a_stop_from_a_rogue_publisher_never_reaches_the_trainer(hosts):
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    rogue = ControlPublisher(endpoint, republish_s=0.05, security=hosts.rogue_evald)
    trainer = ControlSubscriber(endpoint, "r", security=hosts.trainer)
    try:
        rogue.update(wire.ControlState(run_id="r", seq=1, stop_at_step=1, reason="forged"))
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            rogue.tick()
            assert trainer.poll() is None
            time.sleep(0.05)
    finally:
        trainer.close()
        rogue.close()
    # the positive control: the same subscriber configuration hears the real evald
    real = ControlPublisher(endpoint, republish_s=0.05, security=hosts.evald)
    trainer = ControlSubscriber(endpoint, "r", security=hosts.trainer)
    try:
        real.update(wire.ControlState(run_id="r", seq=1, stop_at_step=1, reason="real"))
        wait_for(lambda: real.tick() or trainer.poll(), BOUND_S, "the real evald's state", interval=0.05)
        assert trainer.latest.reason == "real"
    finally:
        trainer.close()
        real.close()


def test_plaintext_tcp_is_refused_by_default_and_untrusted_when_allowed(hosts, caplog):
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    with pytest.raises(auth.SecurityError, match="refusing plaintext"):
        Receiver(endpoint, queue.Queue())
    with pytest.raises(auth.SecurityError, match="refusing plaintext"):
        ControlPublisher(endpoint)
    out: queue.Queue = queue.Queue()
    with caplog.at_level(logging.WARNING):
        receiver = Receiver(endpoint, out, security=SecurityConfig(allow_plaintext=True))
    assert "PLAINTEXT" in caplog.text
    receiver.start()
    sender = Notifier(endpoint, security=SecurityConfig(allow_plaintext=True))
    try:
        sender.send(committed(3))
        assert next_item(out)[0] == ZMQ_UNTRUSTED  # a doorbell, but it may not choose the directory
    finally:
        sender.close(0.1)
        receiver.close()


# --- the trainer's hook: key problems never raise into training ---------------------------------

def test_the_hook_disables_notifications_and_stop_on_key_problems_and_training_goes_on(hosts, tmp_path, caplog):
    from trainer_hooks import EvaldHook

    secret = Path(hosts.keys["client_key"])
    os.chmod(secret, 0o644)  # an exposed secret key
    tcp = f"tcp://127.0.0.1:{free_port()}"
    cases = {"exposed secret": dict(client_key=secret, server_public_key=hosts.keys["server_public_key"]),
             "half the keys": dict(client_key=None, server_public_key=hosts.keys["server_public_key"]),
             "plaintext tcp": dict()}
    for name, keys in cases.items():
        caplog.clear()
        with caplog.at_level(logging.ERROR):
            hook = EvaldHook(tmp_path / name, every_n_steps=1, endpoint=tcp, control_endpoint=tcp,
                             run_id=name, **keys)
            assert hook.step_end(1) is False and hook.step_end(2) is False
            wait_for(lambda: "notifications to" in caplog.text, BOUND_S, f"{name}: the notifier's error")
            hook.train_end(2)
        assert "early stop disabled" in caplog.text, name
        assert hook.errors == 0 and hook.notifier.mechanism is None, name
        assert (tmp_path / name / "RUN.json").exists()  # the checkpoint directory still works


# --- real processes: a trainer and an evald over tcp://127.0.0.1 -------------------------------

def tcp_env(ports) -> dict[str, str]:
    return {"EVALD_ENDPOINT": f"tcp://127.0.0.1:{ports[0]}", "EVALD_CONTROL_ENDPOINT": f"tcp://127.0.0.1:{ports[1]}"}


@pytest.mark.smoke
def test_an_authorised_trainer_is_evaluated_and_stopped_over_curve(tmp_path, procs, hosts):
    ports = (free_port(), free_port())
    keys = hosts.keys
    evald_host = {**tcp_env(ports), "EVALD_SERVER_KEY": str(keys["server_key"]),
                  "EVALD_ALLOWED_KEYS": str(keys["allowed_keys"]), "EVALD_SOCKET_DIR": str(tmp_path / "s1")}
    trainer_host = {**tcp_env(ports), "EVALD_CLIENT_KEY": str(keys["client_key"]),
                    "EVALD_SERVER_PUBLIC_KEY": str(keys["server_public_key"]), "EVALD_SOCKET_DIR": str(tmp_path / "s2")}
    # no --ckpt-dir: evald must learn the directory from an authenticated notification
    evald = start_evald(tmp_path, evald_host, ["--lag-policy", "all", "--patience", "1", "--min-delta", "10",
                                               "--stop-margin-steps", "40"])
    procs.append(evald)
    ckpt = tmp_path / "ckpt"
    # in lockstep with evald (tests/paced_trainer.py, hearing it over CURVE too): it cannot train past the stop
    trainer = start_trainer(tmp_path, ckpt, trainer_host, steps=400, every=10, loop="custom",
                            program=["tests.paced_trainer", "--lockstep"])
    procs.append(trainer)
    assert trainer.wait(400) == 0, trainer.output()[-3000:]
    assert evald.wait(180) == 0, evald.output()[-3000:]
    announced = int(re.search(r"training stops at step (\d+)", evald.output()).group(1))
    stopped = re.search(r"evald asked to stop training: stopping at step (\d+)", trainer.output())
    assert stopped and int(stopped.group(1)) == announced < 400, trainer.output()[-2000:]
    assert "paced: evald done with step 10 before the snapshot at step 20" in trainer.output()  # in lockstep
    assert committed_steps(ckpt)[-1] == announced
    assert f"serving {ckpt.resolve()}" in evald.output()
    assert "PLAINTEXT" not in evald.output() + trainer.output()
    assert hook_stats(trainer.output())["notifications_sent"] > 0


def test_plaintext_tcp_evald_refuses_to_start(tmp_path, procs):
    ports = (free_port(), free_port())
    evald = start_evald(tmp_path, {**tcp_env(ports), "EVALD_SOCKET_DIR": str(tmp_path / "s")}, cpu=None)
    procs.append(evald)
    assert evald.wait(120) == 2
    assert "refusing plaintext on network endpoint" in evald.output() and "evald keys DIR" in evald.output()


def test_a_stop_forged_by_an_unauthorised_process_is_ignored_by_a_training_process(tmp_path, procs, hosts):
    ports = (free_port(), free_port())
    keys = hosts.keys
    trainer_host = {**tcp_env(ports), "EVALD_CLIENT_KEY": str(keys["client_key"]),
                    "EVALD_SERVER_PUBLIC_KEY": str(keys["server_public_key"]), "EVALD_SOCKET_DIR": str(tmp_path / "s")}
    stop = threading.Event()
    rogues = [ControlPublisher(f"tcp://127.0.0.1:{ports[1]}", republish_s=0.02, security=hosts.rogue_evald)]

    def forge() -> None:  # a rogue evald on the trainer's control endpoint, its own key, forging stops
        while not stop.wait(0.02):
            rogues[0].update(wire.ControlState(run_id="forged-run", seq=1, stop_at_step=1, reason="forged"))
    thread = threading.Thread(target=forge, daemon=True)
    thread.start()
    try:
        trainer = start_trainer(tmp_path, tmp_path / "ckpt", trainer_host, steps=40, every=20, loop="custom",
                                extra=["--run-id", "forged-run", "--step-sleep", "0.05"])
        procs.append(trainer)
        assert trainer.wait(300) == 0, trainer.output()[-3000:]
    finally:
        stop.set()
        thread.join(5)
        rogues[0].close()
    assert "asked to stop" not in trainer.output()
    assert committed_steps(tmp_path / "ckpt")[-1] == 40  # it trained to its planned end
    assert hook_stats(trainer.output())["control_messages_ignored"] == 0  # nothing even arrived


def test_only_a_trusted_first_message_chooses_the_directory(tmp_path, caplog):
    from evald.cli.main import parse_config
    from evald.daemon.server import Server

    server = Server(parse_config([], environ={}))
    attached: list[Path] = []
    server.attach = attached.append  # record the choice instead of opening a ledger there
    # the channel as a Receiver reports it: a local socket in a directory private to this uid
    (tmp_path / "sock").mkdir(mode=0o700)
    server.receiver = SimpleNamespace(endpoint=f"ipc://{tmp_path}/sock/notify.sock", authenticated=False)

    def message(name: str) -> wire.CheckpointCommitted:
        return wire.CheckpointCommitted(run_id="r", ckpt_dir=str(tmp_path / name), step=1, path="step_1",
                                        commit_time=1.0)
    with caplog.at_level(logging.WARNING):
        server.events.put((ZMQ_UNTRUSTED, message("forged")))
        server._drain_events(timeout=1)
    assert attached == [] and "an untrusted message never chooses the directory" in caplog.text
    server.events.put((ZMQ, message("real")))
    server._drain_events(timeout=1)
    assert attached == [tmp_path / "real"]
