"""The wire protocol contract: every message round-trips; anything else is a clear ProtocolError."""

from __future__ import annotations

import json
import os

import pytest

from evald.contracts import wire

MAX_DEPTH = 16  # docs/wire-protocol.md, Bounds


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


def _frame(**fields) -> bytes:
    return json.dumps({"v": 1, **fields}).encode()


def _committed(**overrides) -> bytes:
    fields = {"type": "checkpoint_committed", "run_id": "r", "ckpt_dir": "/c", "step": 1,
              "path": "step_000000001", "commit_time": 1.0}
    return _frame(**{**fields, **overrides})


def _metrics(*records) -> bytes:
    return _frame(type="train_metrics", run_id="r", records=list(records))


@pytest.mark.parametrize("frame, expected", [
    (b"\x00\xff garbage", "not UTF-8"),
    (b"[1,2]", "a message is a JSON object"),
    (b'{"v": 2, "type": "run_finished"}', "protocol version 2"),
    (b'{"v": 1, "type": "reboot"}', "unknown message type"),
    (b'{"v": 1, "type": "checkpoint_committed", "run_id": "r"}', "missing field"),
    (_committed(step=-1), r"checkpoint_committed.step: -1 is outside 0..2\*\*63-1"),
    (_committed(path="../../etc"), "checkpoint_committed.path: .* plain entry name"),
    (b"x" * (wire.MAX_MESSAGE_BYTES + 1), "exceeds"),
])
def test_invalid_frames_are_rejected_with_a_reason(frame, expected):
    with pytest.raises(wire.ProtocolError, match=expected):
        wire.decode(frame)


# Each of these, sent once, used to kill evald (exit 1) or make it publish an absurd stop step.
@pytest.mark.parametrize("frame, where, why", [
    (_metrics({"step": 10**30, "wall_time": 1.0, "scalars": {}}), "train_metrics.records[0].step", "outside"),
    (_metrics({"step": float("inf"), "wall_time": 1.0, "scalars": {}}), "train_metrics.records[0].step",
     "must be an integer"),
    (_committed(path="a\u0000.ckpt"), "checkpoint_committed.path", "NUL"),
    (_committed(path="\ud800x.ckpt"), "checkpoint_committed.path", "lone surrogate"),
    (_committed(path="x" * 300 + ".ckpt"), "checkpoint_committed.path", "exceed the limit of 255"),
    (_committed(path="step_" + "9" * 300), "checkpoint_committed.path", "exceed the limit of 255"),
    (_committed(step=10**30), "checkpoint_committed.step", "outside"),
    (_committed(step=True), "checkpoint_committed.step", "must be an integer"),
    (_committed(step=5.0), "checkpoint_committed.step", "must be an integer"),
    (_committed(step=2**63), "checkpoint_committed.step", "outside"),
    (_committed(commit_time=float("nan")), "checkpoint_committed.commit_time", "finite"),
    (_committed(commit_time=10**30), "checkpoint_committed.commit_time", "64-bit"),
    (_committed(path="."), "checkpoint_committed.path", "plain entry name"),
    (_committed(path="a/b"), "checkpoint_committed.path", "plain entry name"),
    (_committed(path="é" * 128), "checkpoint_committed.path", "256 bytes of UTF-8 exceed"),
    (_committed(run_id="r\nfake log line"), "checkpoint_committed.run_id", "control character"),
    (_committed(run_id=""), "checkpoint_committed.run_id", "must not be empty"),
    (_committed(ckpt_dir="/c" * 3000), "checkpoint_committed.ckpt_dir", "limit of 4096"),
    (_committed(ckpt_dir=["/c"]), "checkpoint_committed.ckpt_dir", "must be a string"),
    (_committed(ckpt_dir=None), "checkpoint_committed.ckpt_dir", "must not be null"),
    (_frame(type="run_finished", run_id="r", ckpt_dir="/c", final_step=1e400), "run_finished.final_step",
     "got inf"),
    (_frame(type="control_state", run_id="r", seq=1, stop_at_step=10**30), "control_state.stop_at_step",
     "outside"),
    (_frame(type="control_state", run_id="r", seq=1, lr_advice={"scale": -2}), "control_state.lr_advice.scale",
     "positive"),
    (_frame(type="control_state", run_id="r", seq=1, lr_advice={"id": "x"}), "control_state.lr_advice.id",
     "integer"),
    (_frame(type="control_state", run_id="r", seq=1, lr_advice=[1]), "control_state.lr_advice", "object"),
    (_frame(type="control_state", run_id="r", seq=1, summary={"k": list(range(300))}),
     "control_state.summary['k']",
     "300 items exceed"),
    (_frame(type="control_state", run_id="r", seq=1, summary={"best": 10**20}),
     "control_state.summary['best']",
     "64-bit"),
    (_frame(type="run_announced", run_id="r", ckpt_dir="/c", model_factory={"target": "nocolon"}),
     "run_announced.model_factory.target", "module:function"),
    (_frame(type="run_announced", run_id="r", ckpt_dir="/c", model_factory={"target": "m:f", "search_path": 3}),
     "run_announced.model_factory.search_path", "must be a string"),
    (_frame(type="run_announced", run_id="r", ckpt_dir="/c", data_factory={"target": "m:f", "kwargs": [1]}),
     "run_announced.data_factory.kwargs", "must be an object"),
    (_frame(type="run_announced", run_id="r", ckpt_dir="/c", world_size="4"), "run_announced.world_size",
     "must be an integer"),
])
def test_hostile_field_values_name_the_message_field_and_why(frame, where, why):
    with pytest.raises(wire.ProtocolError) as caught:
        wire.decode(frame)
    text = str(caught.value)
    assert text.startswith(where + ":") and why in text, text
    assert caught.value.reason == ".".join(where.split("[")[0].split(".")[:2])


@pytest.mark.parametrize("record, why", [
    ({"step": 1, "wall_time": 1.0}, "missing 'scalars'"),
    ({"wall_time": 1.0, "scalars": {}}, "missing 'step'"),
    ({"step": 1, "wall_time": "now", "scalars": {}}, "wall_time: must be a finite number"),
    ({"step": 1, "wall_time": 1.0, "scalars": {"loss": True}}, "must be a finite number"),
    ({"step": 1, "wall_time": 1.0, "scalars": {"loss": "NaN"}}, "must be a finite number"),
    ({"step": 1, "wall_time": 1.0, "scalars": {"loss": 10**25}}, "64-bit"),
    ({"step": 1, "wall_time": 1.0, "scalars": {"loss": {"x": 1}}}, "must be a finite number"),
    ({"step": 1, "wall_time": 1.0, "scalars": {"": 1.0}}, "must not be empty"),
    ({"step": 1, "wall_time": 1.0, "scalars": {f"s{i}": 1.0 for i in range(200)}}, "200 scalars exceed"),
    ([1, 2], "must be an object"),
])
def test_malformed_train_metrics_records_never_reach_consumers(record, why):
    with pytest.raises(wire.ProtocolError, match=why):
        wire.decode(_metrics(record))


def test_train_metrics_records_are_normalised_to_their_three_keys():
    message = wire.decode(_metrics({"step": 3, "wall_time": 7, "scalars": {"loss": "inf", "lr": 1},
                                    "extra": "ignored"}))
    assert message.records == ({"step": 3, "wall_time": 7.0, "scalars": {"loss": "inf", "lr": 1}},)
    assert type(message.records[0]["wall_time"]) is float
    with pytest.raises(wire.ProtocolError, match="records exceed"):
        wire.decode(_metrics(*[{"step": 1, "wall_time": 1.0, "scalars": {}}] * 1025))


def test_integer_bounds_are_inclusive():
    assert wire.decode(_committed(step=2**63 - 1)).step == 2**63 - 1
    assert wire.decode(_committed(step=0)).step == 0


def test_version_and_type_must_have_exact_json_types():
    for version in ("true", "1.0", '"1"'):
        with pytest.raises(wire.ProtocolError, match="protocol version") as caught:
            wire.decode(b'{"v": %s, "type": "run_finished"}' % version.encode())
        assert caught.value.reason == "version"
    with pytest.raises(wire.ProtocolError, match="unknown message type"):  # a list is not hashable
        wire.decode(b'{"v": 1, "type": []}')


def test_an_integer_literal_too_long_to_convert_is_a_protocol_error():
    frame = b'{"v":1,"type":"run_finished","run_id":"r","ckpt_dir":"/c","final_step":' + b"9" * 5000 + b"}"
    with pytest.raises(wire.ProtocolError, match="final_step: an integer of 5000 digits"):
        wire.decode(frame)


def test_deep_nesting_is_refused_before_the_parser_recurses():
    for frame in (b"[" * 20000, b"[" * 20000 + b"]" * 20000, b'{"a":' * 5000 + b"1" + b"}" * 5000):
        with pytest.raises(wire.ProtocolError, match="levels deep") as caught:
            wire.decode(frame)
        assert caught.value.reason == "too_deep"


def test_nesting_depth_counts_json_structure_not_brackets_in_strings():
    reason = '[{"' * 1000 + '\\"'  # brackets, quotes and an escaped quote inside a string
    message = wire.decode(_frame(type="run_finished", run_id="r", ckpt_dir="/c", final_step=1, reason=reason))
    assert message.reason == reason
    deepest_allowed = {"a": 1}
    for _ in range(MAX_DEPTH - 3):  # the frame and model_factory objects are 2 levels
        deepest_allowed = {"a": deepest_allowed}
    factory = {"target": "m:f", "kwargs": deepest_allowed}
    frame = _frame(type="run_announced", run_id="r", ckpt_dir="/c", model_factory=factory)
    assert frame.count(b"{") == MAX_DEPTH
    assert wire.decode(frame).model_factory.kwargs == deepest_allowed
    with pytest.raises(wire.ProtocolError, match="levels deep"):
        factory["kwargs"] = {"a": deepest_allowed}
        wire.decode(_frame(type="run_announced", run_id="r", ckpt_dir="/c", model_factory=factory))


def test_non_bytes_and_buffers():
    with pytest.raises(wire.ProtocolError, match="must be bytes"):
        wire.decode("{}")  # type: ignore[arg-type]
    message = wire.RunFinished(run_id="r", ckpt_dir="/c", final_step=4)
    assert wire.decode(memoryview(message.encode())) == message
    with pytest.raises(wire.ProtocolError, match="exceeds"):
        wire.decode(memoryview(b" " * (wire.MAX_MESSAGE_BYTES + 1)))


def test_every_field_of_every_message_has_a_rule():
    from dataclasses import fields

    for cls in wire.MESSAGE_TYPES.values():
        assert {f.name for f in fields(cls)} <= set(wire._FIELD_RULES), cls.TYPE


def test_announcement_file_with_a_lone_surrogate_is_a_protocol_error():
    text = wire.RunAnnounced(run_id="r", ckpt_dir="/c").encode().decode().replace('"r"', '"\ud800"')
    with pytest.raises(wire.ProtocolError, match="not UTF-8"):
        wire.announcement_from_json(text)


def test_stripping_strings_stays_linear_for_an_unterminated_string_of_escaped_quotes():
    """A first version of the nesting check retried its string regex at every escaped quote: this
    1 MiB frame took over 10 minutes. Run in a subprocess so a regression fails instead of hanging;
    the bound is for liveness only (the linear check takes milliseconds)."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("from evald.contracts import wire\n"
            "frame = ('{\"v\":1,\"type\":\"run_finished\",\"reason\":\"' + '[{\\\\\"' * 300000)[:1 << 20].encode()\n"
            "try:\n    wire.decode(frame)\nexcept wire.ProtocolError as exc:\n    print(exc.reason)\n")
    repo = Path(__file__).resolve().parents[3]
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(repo)})
    assert done.stdout.strip() == "not_json", done.stderr
