"""Property tests of the wire boundary: for ANY bytes, ``decode`` returns a message within
the documented bounds or raises ProtocolError, and nothing else; valid messages round-trip.

The bounds are re-stated here independently of wire_fields (from docs/wire-protocol.md),
so a check that silently stops checking fails these properties.
"""

from __future__ import annotations

import json
import math
from dataclasses import fields

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evald.contracts import wire, wire_fields

INT64 = (-(2**63), 2**63 - 1)
FUZZ = settings(max_examples=400, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# ---------------------------------------------------------------- the property

UINT_FIELDS = {"step", "final_step", "seq", "world_size", "total_steps", "every_n_steps", "stop_at_step"}


def _depth(value) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, (list, tuple)):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


def _assert_json_within_bounds(value, where: str) -> None:
    if isinstance(value, bool) or value is None:
        return
    if isinstance(value, int):
        assert INT64[0] <= value <= INT64[1], where
    elif isinstance(value, float):
        assert math.isfinite(value), where
    elif isinstance(value, str):
        assert "\x00" not in value and len(value.encode("utf-8")) <= 4096, where  # raises on a surrogate
    elif isinstance(value, (list, tuple)):
        assert len(value) <= 256, where
        for item in value:
            _assert_json_within_bounds(item, where)
    elif isinstance(value, dict):
        assert len(value) <= 256, where
        for key, item in value.items():
            _assert_json_within_bounds(key, where)
            _assert_json_within_bounds(item, where)
    else:
        raise AssertionError(f"{where}: {type(value).__name__} is not JSON")


def assert_within_bounds(message: wire.Message) -> None:
    """What every consumer of a decoded message may rely on (docs/wire-protocol.md, Bounds)."""
    assert type(message) in wire.MESSAGE_TYPES.values()
    for f in fields(message):
        value, where = getattr(message, f.name), f"{message.TYPE}.{f.name}"
        if value is None:
            continue
        if f.name in UINT_FIELDS:
            assert type(value) is int and 0 <= value <= 2**63 - 1, where
        elif f.name in ("sent_at", "commit_time"):
            assert type(value) is float and math.isfinite(value), where
        elif f.name == "path":
            assert value not in ("", ".", "..") and "/" not in value and "\x00" not in value, where
            assert len(value.encode("utf-8")) <= 255, where
        elif f.name == "records":
            assert len(value) <= 1024
            for record in value:
                assert set(record) == {"step", "wall_time", "scalars"}, where
                assert type(record["step"]) is int and 0 <= record["step"] <= 2**63 - 1, where
                assert type(record["wall_time"]) is float and math.isfinite(record["wall_time"]), where
                assert len(record["scalars"]) <= 128
                for name, scalar in record["scalars"].items():
                    assert isinstance(name, str) and name and not any(ord(c) < 0x20 for c in name), where
                    assert scalar in ("nan", "inf", "-inf") or (
                        type(scalar) in (int, float) and math.isfinite(scalar)), where
                    _assert_json_within_bounds(scalar, where)
        elif isinstance(value, wire.FactorySpec):
            assert ":" in value.target and not any(ord(c) < 0x20 for c in value.target), where
            _assert_json_within_bounds(dict(value.kwargs), where)
            _assert_json_within_bounds(value.search_path, where)
        else:
            _assert_json_within_bounds(value, where)
        if isinstance(value, str) and f.name != "reason":
            assert not any(ord(c) < 0x20 or 0x7f <= ord(c) <= 0x9f for c in value), where
    assert _depth(message.to_dict()) <= 16


def check(frame: bytes) -> wire.Message | None:
    """The property: a message within bounds that round-trips, or ProtocolError, nothing else."""
    try:
        message = wire.decode(frame)
    except wire.ProtocolError as exc:
        assert str(exc)
        return None
    assert_within_bounds(message)
    assert wire.decode(message.encode()) == message
    return message


# ---------------------------------------------------------------- hostile inputs

any_text = st.text(st.characters(codec=None, categories=None), max_size=40)  # includes surrogates, NUL
json_leaf = (st.none() | st.booleans() | st.integers() | st.integers(min_value=2**62, max_value=2**80)
             | st.floats() | any_text)
any_json = st.recursive(json_leaf, lambda inner: st.lists(inner, max_size=4)
                        | st.dictionaries(any_text, inner, max_size=4), max_leaves=25)

JSONISH = '[]{}",:\\0123456789.eE+-truefalsnINfiy \t'
TYPES = sorted(wire.MESSAGE_TYPES)
FIELD_NAMES = sorted({f.name for cls in wire.MESSAGE_TYPES.values() for f in fields(cls)})


@FUZZ
@given(st.binary(max_size=3000))
def test_arbitrary_bytes(frame):
    check(frame)


@FUZZ
@given(st.text(JSONISH, max_size=400))
def test_arbitrary_json_like_text(text):
    check(text.encode())


@FUZZ
@given(any_json)
def test_arbitrary_json(value):
    check(json.dumps(value).encode())


@FUZZ
@given(st.sampled_from(TYPES) | any_json, st.just(1) | any_json,
       st.dictionaries(st.sampled_from(FIELD_NAMES), any_json, max_size=8))
def test_envelopes_with_arbitrary_fields(kind, version, body):
    check(json.dumps({**body, "v": version, "type": kind}).encode())


VALID_BODIES = {
    "run_announced": {"run_id": "r", "ckpt_dir": "/c", "task": "lm", "world_size": 2, "total_steps": 9,
                      "every_n_steps": 3, "model_factory": {"target": "m:f", "kwargs": {"n": 1}},
                      "data_factory": "m:d", "control_endpoint": "ipc:///tmp/c.sock"},
    "checkpoint_committed": {"run_id": "r", "ckpt_dir": "/c", "step": 5, "path": "step_000000005",
                             "commit_time": 1.5},
    "train_metrics": {"run_id": "r", "records": [{"step": 1, "wall_time": 2.0, "scalars": {"loss": 0.5}}]},
    "run_finished": {"run_id": "r", "ckpt_dir": "/c", "final_step": 10, "reason": "completed"},
    "control_state": {"run_id": "r", "seq": 3, "stop_at_step": 12, "reason": "patience",
                      "lr_advice": {"id": 1, "scale": 0.5, "kind": "plateau"}, "summary": {"best": 1.0}},
}

hostile_text = st.one_of(
    any_text,
    st.sampled_from(["", ".", "..", "../x", "a/b", "/abs", "a\x00b", "\ud800", "x\ud800y", "\n", "é" * 128,
                     "x" * 256, "x" * 255, "step_" + "9" * 300, "nan", "inf", "-inf", "NaN"]),
    st.integers(min_value=250, max_value=4200).map(lambda n: "y" * n),
)
hostile_number = st.one_of(
    st.integers(min_value=-(2**64), max_value=2**64), st.sampled_from([2**63 - 1, 2**63, -1, 0, 10**30]),
    st.floats(), st.booleans(),
)
hostile_value = st.one_of(hostile_text, hostile_number, st.none(), any_json,
                          st.lists(hostile_number, max_size=3), st.dictionaries(hostile_text, hostile_number))
hostile_record = st.fixed_dictionaries(
    {"step": hostile_number, "wall_time": hostile_number,
     "scalars": st.dictionaries(hostile_text, st.one_of(hostile_number, hostile_text), max_size=4)})


@FUZZ
@given(st.sampled_from(TYPES), st.data())
def test_valid_envelopes_with_one_hostile_field(kind, data):
    body = json.loads(json.dumps(VALID_BODIES[kind]))
    assert check(json.dumps({"v": 1, "type": kind, **body}).encode()) is not None  # the baseline is valid
    name = data.draw(st.sampled_from(sorted(body) + ["sent_at"]))
    body[name] = data.draw(hostile_value)
    check(json.dumps({"v": 1, "type": kind, **body}).encode())


@FUZZ
@given(st.lists(hostile_record, max_size=3))
def test_hostile_train_metrics_records(records):
    check(json.dumps({"v": 1, "type": "train_metrics", "run_id": "r", "records": records}).encode())


@FUZZ
@given(st.sampled_from(["lr_advice", "summary", "model_factory", "data_factory"]), any_json)
def test_hostile_objects(name, value):
    kind = "run_announced" if name.endswith("factory") else "control_state"
    body = {**VALID_BODIES[kind], name: {"target": "m:f", "kwargs": value} if kind == "run_announced" else value}
    check(json.dumps({"v": 1, "type": kind, **body}).encode())


@FUZZ
@given(st.integers(min_value=0, max_value=60) | st.integers(min_value=60, max_value=5000),
       st.sampled_from(["[", "{\"a\":"]), st.sampled_from(TYPES))
def test_nesting_at_any_depth(depth, opener, kind):
    closer = "]" if opener == "[" else "}"
    nested = opener * depth + "1" + closer * depth
    check(f'{{"v":1,"type":"{kind}","run_id":"r","summary":{nested},"lr_advice":{nested}}}'.encode())


# ---------------------------------------------------------------- valid messages round-trip

printable = st.text(st.characters(codec="utf-8", categories=("L", "N", "P", "S", "Zs")), min_size=1, max_size=30)
entry_names = printable.filter(lambda s: "/" not in s and s not in (".", ".."))
# the bounds are in UTF-8 bytes, and 30 characters can be 120 bytes: keep short fields within theirs
short_names = printable.filter(lambda s: len(s.encode("utf-8")) <= wire_fields.MAX_TASK_BYTES)
uints = st.integers(min_value=0, max_value=2**63 - 1)
times = st.floats(allow_nan=False, allow_infinity=False)
scalar = st.one_of(times, st.sampled_from(["nan", "inf", "-inf"]), st.integers(*INT64))
bounded_json = st.recursive(st.none() | st.booleans() | st.integers(*INT64) | times | printable,
                            lambda inner: st.lists(inner, max_size=3) | st.dictionaries(printable, inner, max_size=3),
                            max_leaves=10)
objects = st.dictionaries(printable, bounded_json, max_size=4)
factories = st.builds(wire.FactorySpec, target=st.builds(lambda a, b: f"{a}:{b}", printable, printable),
                      kwargs=objects, search_path=st.none() | printable)
records = st.lists(st.fixed_dictionaries({"step": uints, "wall_time": times,
                                          "scalars": st.dictionaries(printable, scalar, max_size=5)}),
                   max_size=5).map(tuple)

valid_messages = st.one_of(
    st.builds(wire.RunAnnounced, run_id=printable, ckpt_dir=printable, task=short_names,
              model_factory=st.none() | factories, data_factory=st.none() | factories,
              total_steps=st.none() | uints, every_n_steps=st.none() | uints, world_size=uints,
              control_endpoint=st.none() | printable, sent_at=times),
    st.builds(wire.CheckpointCommitted, run_id=printable, ckpt_dir=printable, step=uints, path=entry_names,
              commit_time=times, sent_at=times),
    st.builds(wire.TrainMetrics, run_id=printable, records=records, sent_at=times),
    st.builds(wire.RunFinished, run_id=printable, ckpt_dir=printable, final_step=uints,
              reason=st.text(max_size=50).filter(lambda s: "\x00" not in s), sent_at=times),
    st.builds(wire.ControlState, run_id=printable, seq=uints, stop_at_step=st.none() | uints,
              reason=printable, lr_advice=st.none() | st.fixed_dictionaries(
                  {"id": uints, "scale": st.floats(min_value=1e-6, max_value=1e6), "kind": short_names,
                   "reason": printable}), summary=st.none() | objects, sent_at=times),
)


@FUZZ
@given(valid_messages)
def test_valid_messages_round_trip(message):
    assert check(message.encode()) == message
