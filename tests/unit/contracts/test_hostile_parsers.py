"""Property tests of the file boundary (issue 12, part 3): whoever writes the checkpoint directory
writes manifests and names files, so for ANY manifest text ``Manifest.from_json`` returns a
manifest within the bounds below or raises LayoutError, and for ANY file name and contents
``foreign_step`` returns a step in 0..2**63-1 or a reason (a string), and nothing else.

The bounds are restated here from docs/checkpoint-layout.md and docs/security.md, independently
of evald/contracts/manifest_fields.py, so a check that silently stops checking fails here.
Before the fix: a manifest ``[[[[...]]]]`` raised RecursionError (a crash loop), ``NaN`` or
``1e400`` as commit_time and ``true`` as step were accepted, and a ``step_num`` entry holding
NaN, nothing or a string raised ValueError/IndexError out of ``foreign_step``.
"""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evald.contracts import layout
from evald.contracts.manifest import LayoutError, Manifest

MAX_STEP = 2**63 - 1
FUZZ = settings(max_examples=300, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])
SAFE_FILE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$")


def valid_manifest(version: int = 2) -> dict:
    weights = {"a": np.zeros((2, 3), np.float32), "b": np.zeros(4, np.int32)}
    files = layout.plan_files(weights)
    params, offset = [], 40
    for name, array in files[0][1]:
        params.append({"name": name, "shape": list(array.shape), "dtype": array.dtype.name,
                       "file": layout.WEIGHTS_FILE, "offset": offset})
        offset += array.nbytes
    data = {"layout_version": 2, "run_id": "r", "step": 5, "epoch": None, "commit_time": 1.7e9,
            "hash": {"algorithm": "sha256", "version": 1},
            "files": [{"name": layout.WEIGHTS_FILE, "bytes": offset, "digest": "0" * 64}],
            "params": params, "resume": {"learning_rate": None, "loss_scale": None, "seed": None,
                                         "data_offset": None}, "producer": {"rank": 0}}
    return data


def assert_within_bounds(m: Manifest) -> None:
    """What every reader of a manifest may rely on (the ledger, TensorBoard, the weights reader)."""
    assert type(m.step) is int and 0 <= m.step <= MAX_STEP
    assert m.epoch is None or (type(m.epoch) is int and 0 <= m.epoch <= MAX_STEP)
    assert type(m.commit_time) is float and math.isfinite(m.commit_time) and m.commit_time >= 0
    assert isinstance(m.run_id, str) and 0 < len(m.run_id.encode()) <= 256
    assert not re.search(r"[\x00-\x1f\x7f-\x9f]", m.run_id)
    sizes = {}
    for f in m.files:
        assert SAFE_FILE.match(f.name) and f.name != layout.MANIFEST_FILE, f.name   # never leaves the directory
        assert type(f.bytes) is int and 8 <= f.bytes <= MAX_STEP
        sizes[f.name] = f.bytes
    for p in m.params:
        assert p.file in sizes
        assert all(type(d) is int and 0 <= d <= MAX_STEP for d in p.shape) and len(p.shape) <= 64
        if p.offset is not None:
            nbytes = math.prod(p.shape) * np.dtype(p.dtype).itemsize
            assert 8 <= p.offset and p.offset + nbytes <= sizes[p.file]


def parse(text: str) -> Manifest | None:
    try:
        manifest = Manifest.from_json(text, source="fuzz")
    except LayoutError:
        return None
    assert_within_bounds(manifest)
    return manifest


# ---------------------------------------------------------------- the manifest parser

HOSTILE_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.sampled_from([-1, -5, 2**63 - 1, 2**63, 10**30, -(2**63) - 1]),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=40),
    st.sampled_from(["", "..", "../../etc/shadow", "/etc/shadow", "a/b", "x\x00y", "\x1b[2J", "MANIFEST.json",
                     "weights.safetensors", "\ud800"]))
JSON_LIKE = st.recursive(HOSTILE_SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                                  st.dictionaries(st.text(max_size=8), inner,
                                                                                  max_size=4)), max_leaves=12)


def _dumps(data) -> str:
    return json.dumps(data, allow_nan=True, ensure_ascii=False)


@FUZZ
@given(st.text(max_size=300))
def test_any_text_is_a_bounded_manifest_or_a_layout_error(text):
    parse(text)


@FUZZ
@given(version=st.sampled_from([2]), path=st.lists(st.sampled_from(
    ["run_id", "step", "epoch", "commit_time", "hash", "files", "params", "resume", "producer", 0, 1, "name", "bytes", "digest", "shape", "dtype", "file", "offset",
     "algorithm", "version", "learning_rate", "seed"]), min_size=1, max_size=3), value=JSON_LIKE)
def test_a_valid_manifest_with_any_field_replaced_is_bounded_or_refused(version, path, value):
    data = valid_manifest(version)
    target = data
    for key in path[:-1]:
        try:
            target = target[key]
        except (KeyError, IndexError, TypeError):
            return
    try:
        target[path[-1]] = value
    except (IndexError, TypeError):
        return
    parse(_dumps(data))


@pytest.mark.parametrize("text", [
    "[]", '"hello"', "null", "[" * 200_000 + "]" * 200_000, '{"a":' * 50_000 + "1" + "}" * 50_000,
    "1" * 5000, "{" * 5000,
])
def test_hostile_manifest_shapes_are_layout_errors(text):
    with pytest.raises(LayoutError):
        Manifest.from_json(text)


@pytest.mark.parametrize("field,value", [
    ("step", -5), ("step", 10**30), ("step", True), ("step", 1.5), ("step", "7"), ("epoch", -1),
    ("commit_time", float("nan")), ("commit_time", float("inf")), ("commit_time", -1.0), ("commit_time", "now"),
    ("run_id", ""), ("run_id", "a\nb"), ("run_id", "x" * 300), ("params", {}), ("files", "weights"),
    ("resume", {"learning_rate": "fast"}), ("resume", {"evil": 1}), ("producer", [1]),
])
def test_each_out_of_bounds_field_is_refused_with_its_name(field, value):
    data = valid_manifest()
    data[field] = value
    with pytest.raises(LayoutError) as raised:
        Manifest.from_json(_dumps(data))
    assert field in str(raised.value) or "NaN" in str(raised.value) or "Infinity" in str(raised.value)


def test_the_valid_manifest_itself_parses():
    assert parse(_dumps(valid_manifest(2))) is not None


# ---------------------------------------------------------------- the foreign-file step parser

NAMES = st.one_of(
    st.from_regex(r"\A[a-z]{0,6}-[0-9]{1,40}_[0-9]{1,40}\.(ckpt|safetensors)\Z", fullmatch=True),
    st.text(st.characters(blacklist_characters="/\x00", blacklist_categories=("Cs",)), min_size=1, max_size=60)
    .map(lambda s: s + ".ckpt"),
)


@pytest.fixture(scope="module")
def mindspore():
    return pytest.importorskip("mindspore")


@FUZZ
@given(name=NAMES, content=st.binary(max_size=512), per_epoch=st.one_of(st.none(), st.integers(1, 10**12)))
def test_any_foreign_file_gives_a_step_in_range_or_a_reason(mindspore, tmp_path, name, content, per_epoch):
    from evald.files.recognise import foreign_step

    if name in (".ckpt", "..ckpt") or len(name.encode()) > 255:
        return
    path = tmp_path / name
    path.write_bytes(content)
    try:
        step = foreign_step(path, per_epoch)
    finally:
        path.unlink()
    assert isinstance(step, str) or (type(step) is int and 0 <= step <= MAX_STEP), step


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 1.5, -3, 2**62, "abc", True,
                                   "empty", "pair"])
def test_a_hostile_step_num_entry_is_a_reason_not_a_crash(mindspore, tmp_path, value):
    from evald.files.recognise import foreign_step

    ms = mindspore
    params = [{"name": "w", "data": ms.Tensor(np.ones(2, np.float32))}]
    if value == "empty":
        params.append({"name": "step_num", "data": ms.Tensor(np.zeros(0, np.int32))})
        append = None
    elif value == "pair":
        params.append({"name": "step_num", "data": ms.Tensor(np.array([3, 4], np.int64))})
        append = None
    else:
        append = {"step_num": value}
    path = tmp_path / "hostile.ckpt"
    ms.save_checkpoint(params, str(path), append_dict=append)
    step = foreign_step(path, None)
    if value == 2**62:
        assert step == 2**62
    else:
        assert isinstance(step, str), step


def test_links_fifos_directories_and_oversize_files_are_never_opened(tmp_path):
    """Examined with lstat only: the verdict comes without reading (a FIFO would block forever)."""
    import os

    from evald.files.recognise import Rejected, recognise

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"s" * 651)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    os.mkfifo(ckpt / "fifo-2_5.ckpt")
    (ckpt / "dir-2_6.ckpt").mkdir()
    os.symlink(outside / "secret", ckpt / "link-1_7.ckpt")
    os.symlink(outside, ckpt / layout.step_dir_name(8))
    os.symlink("/dev/zero", ckpt / "zero-2_9.ckpt")
    for name in ("fifo-2_5.ckpt", "dir-2_6.ckpt", "link-1_7.ckpt", layout.step_dir_name(8), "zero-2_9.ckpt"):
        verdict = recognise(ckpt, name, settle_s=0)
        assert isinstance(verdict, Rejected), (name, verdict)
        assert "651" not in verdict.reason, verdict.reason


def test_epoch_zero_in_a_name_is_no_negative_step(mindspore, tmp_path):
    """Found by the property above: (E-1)*N + S with E = 0 was a negative step for the ledger."""
    from evald.files.recognise import foreign_step

    path = tmp_path / "a-0_0.ckpt"
    path.write_bytes(b"\x12\x10" + b"\0" * 16)
    assert isinstance(foreign_step(path, 1), str)


# ---------------------------------------------------------------- layout version 3: a part's fields


def valid_part_manifest(tmp_path) -> dict:
    """The manifest of a real part (2 writers, one parameter cut into rows), as JSON data."""
    from trainer_hooks.partition_plan import plan_partition

    weights = {"a": np.arange(24, dtype=np.float32).reshape(6, 4), "b": np.zeros(3, np.float32)}
    plan = plan_partition([(n, a.shape, a.nbytes) for n, a in weights.items()], rank=0, writers=(0, 1))
    part = {n: weights[n] if rows is None else weights[n][rows[0]:rows[1]] for n, rows in plan.rows.items()}
    path = layout.write_checkpoint(tmp_path, 5, part, run_id="r", part=plan.part, slices=plan.slices)
    return json.loads((path / layout.MANIFEST_FILE).read_text())


@pytest.mark.parametrize("where,value,named", [
    (("parts", "index"), -1, "parts.index"), (("parts", "count"), "2", "parts.count"),
    (("parts", "ranks"), list(range(70_000)), "parts.ranks"), (("parts", "ranks"), [0, 1.5], "parts.ranks[1]"),
    (("parts",), [1, 2], "parts"), (("files", 0, "rank"), 10**30, "files[0].rank"),
    (("params", 0, "slice"), [[0, 1]] * 65, "slice"), (("params", 0, "slice"), [[0, "x"]], "slice[0]"),
    (("params", 0, "slice"), [[0, 1, 2]], "slice[0]"), (("params", 0, "global_shape"), [-4], "global_shape[0]"),
    (("params", 0, "layout"), {"dev_matrix": [2], "tensor_map": "x"}, "layout.tensor_map"),
])
def test_a_parts_hostile_fields_are_refused_with_their_name(tmp_path, where, value, named):
    data = valid_part_manifest(tmp_path)
    assert Manifest.from_json(_dumps(data)).parts is not None  # the baseline is a valid part
    target = data
    for key in where[:-1]:
        target = target[key]
    target[where[-1]] = value
    with pytest.raises(LayoutError) as raised:
        Manifest.from_json(_dumps(data))
    assert named in str(raised.value), str(raised.value)
