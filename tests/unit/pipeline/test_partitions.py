"""Partitioned snapshots in-process: the plan, the parts on disk, their assembly, and every way they can be wrong.

Real files, a real ledger and real MindSpore networks; the parts are written by
the same code the hook uses (evald.contracts.layout.write_checkpoint with a
PartInfo, trainer_hooks.partition_plan). Tensor-parallel slices are cut here by
the layout rule as MindSpore documents it (``mindspore.Layout``), independently
of evald's own code, and checked against MindSpore's own slicing.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from evald.pipeline.swap.weights import load_parts
from evald.files.recognise import PARTS, CheckpointDeleted, CheckpointError
from evald.config import EvaldConfig, TuningOptions
from evald.contracts import layout
from evald.contracts.partition import PartInfo, SliceSpec, TensorLayout, group_name, part_dir_name
from evald.intake.intake import Intake
from evald.ledger.ledger import DUPLICATE, FAILED, QUEUED, SKIPPED, USED
from trainer_hooks.partition_plan import plan_partition

ms = pytest.importorskip("mindspore")


# ---------------------------------------------------------------- helpers


def model_weights(seed=0):
    rng = np.random.default_rng(seed)
    shapes = {"emb": (64, 16), "l0.w": (16, 16), "l0.b": (16,), "l1.w": (16, 48), "l1.b": (48,), "head": (48, 8),
              "scale": ()}
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}


class Net(ms.nn.Cell):
    """A network whose parameters are exactly ``shapes`` (relative names = the given names)."""

    def __init__(self, weights):
        super().__init__()
        self.params = ms.ParameterTuple([ms.Parameter(ms.Tensor(np.zeros_like(a)), name=n) for n, a in weights.items()])

    def parameters_and_names(self, *args, **kwargs):
        return [(p.name, p) for p in self.params]


def network_for(weights):
    from evald.pipeline.swap.hot_swap import NetworkWeights

    return NetworkWeights(Net(weights))


def loaded(nw):
    return {name: nw._params[name].asnumpy().copy() for name in nw.specs}


def write_parts(ckpt, step, weights, writers, *, run_id="run", layouts=None, holds=None, only=None):
    """Every writer's part as the hook writes it: plan, take its rows/slices, commit. Returns the plans."""
    params = [(n, a.shape, a.nbytes) for n, a in weights.items()]
    plans = {}
    for rank in writers:
        local = weights if layouts is None else local_slices(weights, layouts, rank)
        plan = plan_partition([(n, a.shape, a.nbytes) for n, a in local.items()] if layouts else params,
                              rank=rank, writers=writers, layouts=layouts, holds=holds and holds[rank])
        plans[rank] = plan
        if only is not None and rank not in only:
            continue
        part = {n: local[n] if r is None else local[n][r[0]:r[1]] for n, r in plan.rows.items()}
        layout.write_checkpoint(ckpt, step, part, run_id=run_id, part=plan.part, slices=plan.slices)
    return plans


def intake_for(ckpt, ledger, timeout_s=300.0):
    config = dataclasses.replace(EvaldConfig(), tuning=TuningOptions(parts_timeout_s=timeout_s))
    return Intake(ckpt, ledger, config)


def find_all(intake, ckpt, via="rescan"):
    for entry in sorted(p.name for p in ckpt.iterdir()):
        intake.found(entry, via)


# ---------------------------------------------------------------- the documented layout rule, written here


def documented_cut(full, dev_matrix, tensor_map, device):
    """mindspore.Layout: device numbers are row-major coordinates in dev_matrix; tensor dimension i
    with tensor_map[i] = k >= 0 is cut into dev_matrix[-1-k] equal pieces, device takes piece coord[-1-k]."""
    coordinate = np.unravel_index(device, dev_matrix)
    index = []
    for dim, k in enumerate(tensor_map):
        if k == -1:
            index.append(slice(None))
            continue
        n = dev_matrix[len(dev_matrix) - 1 - k]
        width = full.shape[dim] // n
        c = coordinate[len(dev_matrix) - 1 - k]
        index.append(slice(c * width, (c + 1) * width))
    return full[tuple(index)]


TP_CASES = {  # name: (full shape, device matrix, aliases the tensor dims are cut by)
    "qkv": ((8, 12), (2, 2, 2), ("None", "mp")),             # column parallel; replicated over dp, sp
    "proj": ((12, 8), (2, 2, 2), ("mp", "None")),            # row parallel
    "emb": ((16, 6), (2, 2, 2), ("sp", "mp")),               # both dimensions cut
    "cube": ((4, 6, 8), (2, 2, 2), ("dp", "None", "sp")),
    "bias": ((8,), (2, 2, 2), ("None",)),                    # not cut at all: a replica on every device
}


def tp_setup():
    rng = np.random.default_rng(3)
    weights, layouts = {}, {}
    for name, (shape, dev, dims) in TP_CASES.items():
        spec = ms.Layout(dev, ("dp", "sp", "mp"))(*dims).to_dict()  # MindSpore's own tensor map for the cut
        weights[name] = rng.standard_normal(shape).astype(np.float32)
        layouts[name] = TensorLayout(tuple(spec["device_matrix"]), tuple(spec["tensor_map"]))
    return weights, layouts


def local_slices(full_weights, layouts, device):
    return {n: np.ascontiguousarray(documented_cut(a, layouts[n].dev_matrix, layouts[n].tensor_map, device))
            for n, a in full_weights.items()}


# ---------------------------------------------------------------- the plan


@pytest.mark.parametrize("writers", [2, 3, 4])
def test_replicated_weights_are_shared_out_by_bytes_each_exactly_once(writers):
    weights = model_weights()
    weights["big"] = np.zeros((1000, 16), np.float32)  # most of the bytes: cut into rows for several ranks
    params = [(n, a.shape, a.nbytes) for n, a in weights.items()]
    plans = [plan_partition(params, rank=r, writers=range(writers)) for r in range(writers)]
    total = sum(a.nbytes for a in weights.values())
    assert {p.total_bytes for p in plans} == {total}
    covered = {n: [] for n in weights}
    for plan in plans:
        assert plan.part == PartInfo(plan.part.index, writers, tuple(range(writers)))
        for name, rows in plan.rows.items():
            covered[name].append(rows or (0, weights[name].shape[0] if weights[name].ndim else 1))
    for name, ranges in covered.items():  # every row of every parameter written once, by one rank
        ranges.sort()
        assert ranges[0][0] == 0 and all(a[1] == b[0] for a, b in zip(ranges, ranges[1:])), (name, ranges)
        assert ranges[-1][1] == (weights[name].shape[0] if weights[name].ndim else 1)
    assert len(covered["big"]) == writers
    assert max(p.nbytes for p in plans) <= 1.15 * total / writers, [p.nbytes for p in plans]
    assert sum(p.nbytes for p in plans) == total


def test_with_holds_each_rank_writes_exactly_what_it_holds():
    weights = model_weights()
    params = [(n, a.shape, a.nbytes) for n, a in weights.items()]
    first = {"emb", "l0.w", "l0.b"}
    plan0 = plan_partition(params, rank=0, writers=(0, 1), holds=first.__contains__)
    plan1 = plan_partition(params, rank=1, writers=(0, 1), holds=lambda n: n not in first)
    assert set(plan0.rows) == first and set(plan1.rows) == set(weights) - first
    assert all(r is None for r in [*plan0.rows.values(), *plan1.rows.values()])


def test_the_documented_rule_here_is_mindsporess_own_slicing():
    from mindspore.parallel._tensor import _load_tensor  # MindSpore's slicer (private): a cross-check only

    weights, layouts = tp_setup()
    for name, full in weights.items():
        lay = layouts[name]
        for device in range(lay.device_count):
            ours = documented_cut(full, lay.dev_matrix, lay.tensor_map, device)
            theirs = _load_tensor(ms.Tensor(full), list(lay.dev_matrix), list(lay.tensor_map), rank_id=device)
            assert np.array_equal(ours, theirs), (name, device)
            region = lay.region(full.shape, device)
            assert np.array_equal(full[tuple(slice(a, b) for a, b in region)], ours)


# ---------------------------------------------------------------- on disk


def test_a_part_round_trips_as_layout_version_3(tmp_path):
    weights = model_weights()
    plans = write_parts(tmp_path, 7, weights, (3, 5), run_id="r")
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [part_dir_name(7, 0, 2), part_dir_name(7, 1, 2)]
    for index, name in enumerate(names):
        manifest = layout.read_manifest(tmp_path / name)
        assert manifest.layout_version == 3 and manifest.parts == PartInfo(index, 2, (3, 5))
        assert {f.rank for f in manifest.files} == {(3, 5)[index]}
        assert layout.Manifest.from_json(manifest.to_json()) == manifest
        assert {p.name for p in manifest.params} == set(plans[(3, 5)[index]].rows)
    assert layout.list_committed(tmp_path) == []  # not whole snapshots: an older evald does not read them


# ---------------------------------------------------------------- assembly: loading


@pytest.mark.parametrize("in_place", [True, False])
def test_data_parallel_parts_load_bit_identical_to_the_whole_snapshot(tmp_path, in_place):
    from evald.pipeline.swap.hot_swap import NetworkWeights

    weights = model_weights()
    weights["big"] = np.random.default_rng(1).standard_normal((999, 16)).astype(np.float32)  # cut into rows
    write_parts(tmp_path, 10, weights, range(3))
    nw = NetworkWeights(Net(weights), in_place=in_place)  # rows read in place, or joined by MindSpore
    load_parts(nw, tmp_path, group_name(10, 3))
    got = loaded(nw)
    assert nw.valid and all(np.array_equal(got[n], weights[n]) for n in weights)
    whole = layout.write_checkpoint(tmp_path / "whole", 10, weights, run_id="run")
    other = network_for(weights)
    other.load(whole, layout.read_manifest(whole))
    assert all(np.array_equal(loaded(other)[n], got[n]) for n in weights)


@pytest.mark.parametrize("in_place", [True, False])
def test_tensor_parallel_slices_are_reassembled_bit_exactly_by_mindspore(tmp_path, in_place):
    weights, layouts = tp_setup()
    plans = write_parts(tmp_path, 4, weights, range(8), layouts=layouts)
    # Replicas are written once: 4 distinct slices of "qkv" over 8 devices, the bias once in all.
    written = {n: sum(n in p.rows for p in plans.values()) for n in weights}
    assert written == {"qkv": 2, "proj": 2, "emb": 4, "cube": 4, "bias": 1}, written
    from evald.pipeline.swap.hot_swap import NetworkWeights

    nw = NetworkWeights(Net(weights), in_place=in_place)
    load_parts(nw, tmp_path, group_name(4, 8))
    got = loaded(nw)
    for name, full in weights.items():
        assert got[name].tobytes() == full.tobytes(), name


def test_parts_that_do_not_make_up_the_network_or_have_gone_are_clear_errors(tmp_path):
    weights = model_weights()
    write_parts(tmp_path, 3, {n: a for n, a in weights.items() if n != "head"}, range(2))
    with pytest.raises(CheckpointError, match="2 parts of step 3 do not make up the evaluation network: "
                                              "missing parameters \\[head\\]"):
        load_parts(network_for(weights), tmp_path, group_name(3, 2))
    write_parts(tmp_path, 4, weights, range(2))
    import shutil

    shutil.rmtree(tmp_path / part_dir_name(4, 1, 2))
    with pytest.raises(CheckpointDeleted, match="part-00001-of-00002: deleted"):
        load_parts(network_for(weights), tmp_path, group_name(4, 2))


# ---------------------------------------------------------------- assembly: intake


def test_a_step_is_admitted_once_when_its_last_part_arrives_whatever_the_order(setup):
    ckpt, ledger = setup
    intake = intake_for(ckpt, ledger)
    write_parts(ckpt, 20, model_weights(), range(4))
    names = sorted(p.name for p in ckpt.iterdir())
    for name in [names[2], names[0], names[3]]:
        intake.found(name, "watchdog")
        assert ledger.steps() == [] and intake.settling
    intake.found(names[1], "zmq")
    for name in names:
        intake.found(name, "rescan")  # found again by every source: judged once
    [row] = ledger.steps()
    assert (row.step, row.state, row.kind, row.source) == (20, QUEUED, PARTS, group_name(20, 4))
    assert {n: s for n, _, s, _ in ledger.files()} == {group_name(20, 4): USED, **{n: USED for n in names}}
    assert not intake.settling
    fresh = intake_for(ckpt, ledger)  # a restart: nothing is admitted twice
    find_all(fresh, ckpt)
    assert len(ledger.steps()) == 1 and not fresh.settling


def test_a_step_missing_a_part_past_the_timeout_is_recorded_incomplete_naming_the_rank(setup):
    ckpt, ledger = setup
    intake = intake_for(ckpt, ledger, timeout_s=0.0)
    write_parts(ckpt, 40, model_weights(), (0, 1, 2, 3), only=(0, 1, 3))
    find_all(intake, ckpt)
    assert ledger.steps() == []
    intake.recheck_settled()
    [row] = ledger.steps()
    assert row.state == SKIPPED and row.reason.startswith("incomplete:"), row
    assert "3 of the 4 parts of step 40" in row.reason and "missing part 2 (rank 2)" in row.reason
    [record] = ledger.pending_records()
    assert (record.step, list(record.texts)) == (40, ["evald/skipped"])
    # The missing part, late: the step stays as recorded; it is never evaluated half-built.
    write_parts(ckpt, 40, model_weights(), (0, 1, 2, 3), only=(2,))
    intake.found(part_dir_name(40, 2, 4), "watchdog")
    assert ledger.step(40).state == SKIPPED
    assert ledger.file_status(part_dir_name(40, 2, 4)) == DUPLICATE


def test_overlapping_parts_fail_the_step_with_the_reason(setup):
    ckpt, ledger = setup
    intake = intake_for(ckpt, ledger)
    weights = model_weights()
    both = {0: lambda n: n != "head", 1: lambda n: n in ("head", "emb")}  # emb in both parts
    write_parts(ckpt, 5, weights, (0, 1), holds=both)
    find_all(intake, ckpt)
    [row] = ledger.steps()
    assert row.state == FAILED and "'emb' is held whole by" in row.reason and "overlapping parts" in row.reason
    assert {s for _, _, s, _ in ledger.files()} == {"rejected"}


def test_slices_with_a_gap_fail_the_step(setup):
    ckpt, ledger = setup
    intake = intake_for(ckpt, ledger)
    w = np.arange(12, dtype=np.float32).reshape(4, 3)
    for index, rows in enumerate([(0, 1), (2, 4)]):  # row 1 is in no part
        layout.write_checkpoint(ckpt, 6, {"w": w[rows[0]:rows[1]]}, run_id="r", part=PartInfo(index, 2, (0, 1)),
                                slices={"w": SliceSpec((rows, (0, 3)), (4, 3))})
    find_all(intake, ckpt)
    [row] = ledger.steps()
    assert row.state == FAILED and "cover 9 of its 12 elements" in row.reason and "gap" in row.reason


def test_a_part_from_another_run_fails_the_step_at_once_naming_it(setup):
    ckpt, ledger = setup
    intake = intake_for(ckpt, ledger)
    intake.run_id = "new"
    weights = model_weights()
    write_parts(ckpt, 8, weights, range(3), run_id="old", only=(1,))
    write_parts(ckpt, 8, weights, range(3), run_id="new", only=(0,))
    find_all(intake, ckpt)
    [row] = ledger.steps()  # not waiting for part 2: the mix can never make a snapshot
    assert row.state == FAILED and not intake.settling
    assert row.reason == (f"parts from another run: {part_dir_name(8, 1, 3)} (rank 1) is from run 'old', "
                          f"the other parts from run 'new'")


def test_parts_that_disagree_on_the_split_fail_the_step(setup):
    ckpt, ledger = setup
    intake = intake_for(ckpt, ledger)
    write_parts(ckpt, 9, model_weights(), range(2), only=(0,))
    write_parts(ckpt, 9, model_weights(), range(3), only=(2,))
    find_all(intake, ckpt)
    [row] = ledger.steps()
    assert row.state == FAILED and "disagree on how the step was split" in row.reason


def test_a_part_renamed_by_hand_is_rejected(setup):
    ckpt, ledger = setup
    intake = intake_for(ckpt, ledger)
    write_parts(ckpt, 11, model_weights(), range(2))
    (ckpt / part_dir_name(11, 1, 2)).rename(ckpt / part_dir_name(11, 1, 3))
    intake.found(part_dir_name(11, 1, 3), "rescan")
    assert ledger.step(11).state == FAILED and "renamed or copied by hand" in ledger.step(11).reason


def test_a_whole_snapshot_and_parts_of_one_step_give_one_row(setup):
    ckpt, ledger = setup
    intake = intake_for(ckpt, ledger)
    weights = model_weights()
    layout.write_checkpoint(ckpt, 12, weights, run_id="run")
    write_parts(ckpt, 12, weights, range(2))
    find_all(intake, ckpt)
    [row] = ledger.steps()
    assert row.source == layout.step_dir_name(12)
    assert {ledger.file_status(part_dir_name(12, i, 2)) for i in range(2)} == {DUPLICATE}


# ---------------------------------------------------------------- the hook, two ranks in one process


def test_two_hooks_write_one_snapshot_in_two_parts_and_only_the_first_announces(tmp_path, monkeypatch):
    from trainer_hooks import EvaldHook

    monkeypatch.setenv("EVALD_SOCKET_DIR", str(tmp_path))
    weights = model_weights()
    nets = [Net(weights) for _ in range(2)]
    for net in nets:
        for p in net.params:
            p.set_data(ms.Tensor(weights[p.name]))
    hooks = [EvaldHook(tmp_path / "ckpt", every_n_steps=5, network=net, rank=r, world_size=2, run_id="two",
                       obey_stop=False, endpoint=f"ipc://{tmp_path}/n.sock") for r, net in enumerate(nets)]
    for hook in hooks:
        hook.step_end(5)
    for hook in hooks:
        hook.train_end(5)
    ckpt = tmp_path / "ckpt"
    assert sorted(p.name for p in ckpt.iterdir()) == sorted(
        [layout.RUN_FILE, layout.RUN_END_FILE, part_dir_name(5, 0, 2), part_dir_name(5, 1, 2)])
    sizes = [sum(f.bytes for f in layout.read_manifest(ckpt / part_dir_name(5, i, 2)).files) for i in range(2)]
    assert max(sizes) < 0.75 * sum(sizes)  # each rank wrote about half
    nw = network_for(weights)
    load_parts(nw, ckpt, group_name(5, 2))
    assert all(np.array_equal(loaded(nw)[n], weights[n]) for n in weights)
    assert [h.errors for h in hooks] == [0, 0]


def test_plans_agree_across_ranks_for_any_writer_set():
    weights = model_weights()
    params = [(n, a.shape, a.nbytes) for n, a in weights.items()]
    for count in (2, 5):
        for writers in itertools.combinations(range(6), count):
            plans = [plan_partition(params, rank=r, writers=writers) for r in writers]
            rows = sorted((n, r or (0, max(1, weights[n].shape[0] if weights[n].ndim else 1)))
                          for p in plans for n, r in p.rows.items())
            for name, group in itertools.groupby(rows, key=lambda t: t[0]):
                ranges = [r for _, r in group]
                assert ranges[0][0] == 0 and all(a[1] == b[0] for a, b in zip(ranges, ranges[1:])), (writers, name)
            assert {n for n, _ in rows} == set(weights)
            assert sum(p.nbytes for p in plans) == plans[0].total_bytes


def test_evald_retry_judges_the_parts_of_a_failed_step_again(setup):
    import shutil

    from evald.ledger.requeue import retry

    ckpt, ledger = setup
    intake = intake_for(ckpt, ledger)
    weights = model_weights()
    write_parts(ckpt, 5, weights, (0, 1), holds={0: lambda n: n != "head", 1: lambda n: n in ("head", "emb")})
    find_all(intake, ckpt)
    assert ledger.step(5).state == FAILED
    for index in range(2):  # the trainer's side is fixed: the parts are written again, right this time
        shutil.rmtree(ckpt / part_dir_name(5, index, 2))
    write_parts(ckpt, 5, weights, (0, 1))
    done = retry(ledger, None, "operator")
    assert sorted(done.rejudged) == sorted([group_name(5, 2), part_dir_name(5, 0, 2), part_dir_name(5, 1, 2)])
    intake.forget_judged()
    find_all(intake, ckpt)
    assert (ledger.step(5).state, ledger.step(5).kind) == (QUEUED, PARTS)


# ---------------------------------------------------------------- the swap check over parts


@pytest.mark.parametrize("mode", ["sampled", "full"])
@pytest.mark.parametrize("cut", ["rows", "tensor-parallel"])
def test_the_swap_check_proves_each_part_and_catches_a_parameter_left_behind(tmp_path, mode, cut):
    from evald.pipeline.swap.hot_swap import NetworkWeights
    from evald.pipeline.swap.swap_check import SwapMismatch, check_parts, parts_digest

    if cut == "rows":
        weights = model_weights()
        weights["big"] = np.random.default_rng(1).standard_normal((999, 16)).astype(np.float32)
        write_parts(tmp_path, 10, weights, range(3))
        group = group_name(10, 3)
    else:
        weights, layouts = tp_setup()
        write_parts(tmp_path, 10, weights, range(8), layouts=layouts)
        group = group_name(10, 8)
    net = Net(weights)
    nw = NetworkWeights(net)
    read = load_parts(nw, tmp_path, group)
    params = dict(net.parameters_and_names())
    done = check_parts(params, mode=mode, step=10, parts=read)
    assert done.parameters >= len(weights) and not done.unchecked, done.describe()
    digest, _ = parts_digest(read)
    assert digest == parts_digest(load_parts(NetworkWeights(Net(weights)), tmp_path, group))[0]
    name = max(weights, key=lambda n: weights[n].size)  # a parameter the swap "left behind"
    params[name].set_data(ms.Tensor(np.zeros_like(weights[name])))
    held_by = [path.name for path, m in read.members if any(p.name == name for p in m.params)]
    with pytest.raises(SwapMismatch, match=repr(name) if mode == "sampled" else f"in {held_by[0]}/"):
        check_parts(params, mode=mode, step=10, parts=read)


def test_a_part_directory_replaced_by_a_link_out_is_not_read(tmp_path):
    from evald.pipeline.swap.hot_swap import NetworkWeights

    weights = model_weights()
    ckpt = tmp_path / "ckpt"
    write_parts(ckpt, 10, weights, range(2))
    outside = tmp_path / "outside"
    (ckpt / part_dir_name(10, 1, 2)).rename(outside)
    (ckpt / part_dir_name(10, 1, 2)).symlink_to(outside)
    with pytest.raises(CheckpointError, match="link"):
        load_parts(NetworkWeights(Net(weights)), ckpt, group_name(10, 2))
