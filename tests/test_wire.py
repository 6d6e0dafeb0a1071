"""The wire protocol contract: every message round-trips; anything else is a clear ProtocolError."""

from __future__ import annotations

import json
import math

import pytest

from evald.contracts import wire


@pytest.mark.parametrize("message", [
    wire.RunAnnounced(run_id="r", ckpt_dir="/c", model_factory=wire.FactorySpec("m:f", {"a": 1}, "/p"),
                      data_factory=wire.FactorySpec("m:d"), total_steps=10, every_n_steps=5, world_size=4),
    wire.CheckpointCommitted(run_id="r", ckpt_dir="/c", step=5, path="step_000000005", commit_time=1.5),
    wire.TrainMetrics(run_id="r", records=({"step": 1, "wall_time": 2.0, "scalars": {"loss": "nan"}},)),
    wire.RunFinished(run_id="r", ckpt_dir="/c", final_step=10, reason="completed"),
    wire.ControlState(run_id="r", seq=3, stop_at_step=12, reason="patience", lr_advice={"scale": 0.5}),
])
def test_round_trip(message):
    assert wire.decode(message.encode()) == message


@pytest.mark.parametrize("frame, expected", [
    (b"\x00\xff garbage", "not UTF-8 JSON"),
    (b"[1,2]", "expected a JSON object"),
    (b'{"v": 2, "type": "run_finished"}', "protocol version 2"),
    (b'{"v": 1, "type": "reboot"}', "unknown message type"),
    (b'{"v": 1, "type": "checkpoint_committed", "run_id": "r"}', "missing field"),
    (json.dumps({"v": 1, "type": "checkpoint_committed", "run_id": "r", "ckpt_dir": "/c", "step": -1,
                 "path": "step_1", "commit_time": 1}).encode(), "non-negative integer"),
    (json.dumps({"v": 1, "type": "checkpoint_committed", "run_id": "r", "ckpt_dir": "/c", "step": 1,
                 "path": "../../etc", "commit_time": 1}).encode(), "plain directory name"),
    (b"x" * (wire.MAX_MESSAGE_BYTES + 1), "exceeds"),
])
def test_invalid_frames_are_rejected_with_a_reason(frame, expected):
    with pytest.raises(wire.ProtocolError, match=expected):
        wire.decode(frame)


def test_non_finite_scalars_survive_json():
    for value in (float("nan"), float("inf"), -float("inf"), 1.5):
        decoded = wire.decode_scalar(json.loads(json.dumps(wire.encode_scalar(value))))
        assert decoded == value or (math.isnan(value) and math.isnan(decoded))


def test_default_endpoints_are_local_and_overridable(monkeypatch, tmp_path):
    monkeypatch.delenv(wire.ENV_ENDPOINT, raising=False)
    monkeypatch.setenv("EVALD_SOCKET_DIR", str(tmp_path / "s"))
    assert wire.default_endpoint() == f"ipc://{tmp_path}/s/notify.sock"
    wire.ensure_socket_dir(wire.default_endpoint())
    assert (tmp_path / "s").stat().st_mode & 0o777 == 0o700
    monkeypatch.setenv(wire.ENV_ENDPOINT, "tcp://127.0.0.1:5999")
    assert wire.default_endpoint() == "tcp://127.0.0.1:5999"


def test_socket_dir_writable_by_others_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    with pytest.raises(PermissionError, match="not private"):
        wire.ensure_socket_dir(f"ipc://{shared}/n.sock")
