"""Issue 35, acceptance: "The main loop never blocks more than 2 s on any file the checkpoint directory holds."

For every path evald reads in a checkpoint directory, a FIFO is put there, and evald's real Server is driven
turn by turn (``Server.on_tick``: the rescan, the intake, the evaluation). Each turn (and the start-up, whose
first rescan reads the directory) must return within 2 s: the loop runs on its own thread and the test waits
2 s for each turn; a FIFO opened blocking waits forever for a writer. The entry is recorded (failed, with a
reason saying it is a FIFO, or not a regular file) or deferred (no verdict, e.g. a tracker that commits nothing), and a good checkpoint
written afterwards is still evaluated.

Where the intake itself would already refuse the FIFO, it is also put there after the intake judged the entry,
just before the evaluation reads it (``load``): a file swapped between the two. The evaluation is a stand-in
for the MindSpore pipeline that calls the real loaders (evald.pipeline.swap.weights.load_into into a real
NetworkWeights of a one-parameter network) and reports the mean weight.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import queue
import threading
from pathlib import Path
from typing import Callable

import mindspore as ms
import numpy as np
import pytest

from evald.config import EvaldConfig
from evald.contracts import layout, wire
from evald.contracts.partition import PartInfo, SliceSpec
from evald.daemon.server import Server
from evald.files.errors import CheckpointDeleted, CheckpointError
from evald.ledger.ledger import DELETED, EVALUATED, FAILED, REJECTED
from evald.pipeline.network import EvalResult
from evald.pipeline.pipeline import Evaluated, Failed
from evald.pipeline.swap.hot_swap import NetworkWeights
from evald.pipeline.swap.weights import load_into
from tests.checkpoint2_layout import save as save_iteration
from tests.unit.daemon.rig import RUN_ID, MeanWeightPipeline, config, stage

BOUND_S = 2.0                       # the bound for one turn of the main loop
W10 = np.full(4, 10.0, np.float32)  # the weights of step 10, whatever carries it
SUBJECT_STEP, GOOD_STEP = 10, 20

pytestmark = pytest.mark.usefixtures("private_umask")


class Net(ms.nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.w = ms.Parameter(ms.Tensor(np.zeros(4, np.float32)), name="w")


class LoaderPipeline(MeanWeightPipeline):
    """The real loaders (load_into: evald's layout, parts, foreign files, Checkpoint 2.0) into a real network;
    ``plant`` runs just before step 10 is read (a file swapped after the intake judged it)."""

    def __init__(self, plant: Callable[[], None] | None) -> None:
        super().__init__()
        self.plant = plant
        self.weights = NetworkWeights(Net())

    def evaluate(self, ckpt_dir: Path, row):
        if self.plant is not None and row.step == SUBJECT_STEP:
            self.plant()
        try:
            load_into(self.weights, ckpt_dir / row.source, row.kind)
        except CheckpointDeleted as exc:
            return Failed(str(exc), DELETED)
        except CheckpointError as exc:
            return Failed(str(exc))
        self.evaluated.append(row.step)
        return Evaluated(EvalResult({"eval/loss": float(self.weights.network.w.asnumpy().mean())}, {}, 0.0, 0.0))


# ---------------------------------------------------------------- what step 10 is carried by

def _evald_step(ckpt: Path) -> None:
    layout.write_checkpoint(ckpt, SUBJECT_STEP, {"w": W10}, run_id=RUN_ID)


def _parts(ckpt: Path) -> None:
    for index, rows in enumerate([(0, 2), (2, 4)]):
        layout.write_checkpoint(ckpt, SUBJECT_STEP, {"w": W10[rows[0]:rows[1]]}, run_id=RUN_ID,
                                part=PartInfo(index, 2, (0, 1)), slices={"w": SliceSpec((rows,), (4,))})


def _foreign(fmt: str) -> Callable[[Path], None]:
    def write(ckpt: Path) -> None:
        ms.save_checkpoint([{"name": "w", "data": ms.Tensor(W10)}], str(ckpt / f"net-1_{SUBJECT_STEP}.{fmt}"),
                           format=fmt)
    return write


def _mindformers(ckpt: Path) -> None:
    """MindFormers' legacy layout, epoch 2: the weights-only file's step is in the full checkpoint beside it."""
    for sub, name, extra in (("checkpoint_network/rank_0", "llama_rank_0-network-2_5.ckpt", None),
                             ("checkpoint/rank_0", "llama_rank_0-2_5.ckpt", {"step_num": SUBJECT_STEP})):
        (ckpt / sub).mkdir(parents=True, exist_ok=True)
        ms.save_checkpoint([{"name": "w", "data": ms.Tensor(W10)}], str(ckpt / sub / name), append_dict=extra)
    (ckpt / "checkpoint/rank_0/meta.json").write_text('{"last_epoch": 2, "last_step": 5}')


def _iteration(world: int) -> Callable[[Path], None]:
    return lambda ckpt: save_iteration(ckpt / "checkpoint", SUBJECT_STEP, world, weights={"w": W10}) and None


ITER = "checkpoint/iteration_00000010"
FAILS, REJECTS, DEFERS, EVALUATES = "failed", "rejected", "deferred", "evaluated"
CASES = [  # (what carries step 10, where the FIFO goes, when: before the start or just before the read, outcome)
    (None, layout.RUN_FILE, "start", DEFERS),
    (None, layout.RUN_END_FILE, "start", DEFERS),
    (_evald_step, f"step_000000010/{layout.MANIFEST_FILE}", "start", FAILS),
    (_evald_step, f"step_000000010/{layout.WEIGHTS_FILE}", "start", FAILS),
    (_evald_step, f"step_000000010/{layout.WEIGHTS_FILE}", "load", FAILS),
    (_parts, f"step_000000010-part-00000-of-00002/{layout.MANIFEST_FILE}", "start", FAILS),
    (_parts, f"step_000000010-part-00001-of-00002/{layout.WEIGHTS_FILE}", "load", FAILS),
    (_foreign("ckpt"), "net-1_10.ckpt", "start", REJECTS),
    (_foreign("ckpt"), "net-1_10.ckpt", "load", FAILS),
    (_foreign("safetensors"), "net-1_10.safetensors", "load", FAILS),
    (_mindformers, "checkpoint_network/rank_0/llama_rank_0-network-2_5.ckpt", "start", REJECTS),
    (_mindformers, "checkpoint_network/rank_0/llama_rank_0-network-2_5.ckpt", "load", FAILS),
    (_mindformers, "checkpoint/rank_0/llama_rank_0-2_5.ckpt", "start", REJECTS),   # and the weights file
    (_mindformers, "checkpoint/rank_0/meta.json", "start", EVALUATES),         # never read
    (_iteration(2), "checkpoint/latest_checkpointed_iteration.txt", "start", DEFERS),
    (_iteration(2), f"{ITER}/common.json", "start", FAILS),
    (_iteration(2), f"{ITER}/metadata.json", "start", FAILS),
    (_iteration(2), f"{ITER}/llama-model-0000000-0000002.safetensors", "start", FAILS),
    (_iteration(2), f"{ITER}/llama-model-0000000-0000002.safetensors", "load", FAILS),
    (_iteration(1), f"{ITER}/llama-model-0000000-0000001.safetensors", "start", FAILS),
    (_iteration(1), f"{ITER}/llama-model-0000000-0000001.safetensors", "load", FAILS),
]


def _fifo(path: Path) -> None:
    if os.path.lexists(path):
        os.chmod(path, 0o600)
        os.unlink(path)
    os.mkfifo(path)


def _release(path: Path) -> None:
    """Open the FIFO for writing without blocking: a reader stuck in open() (the defect) is let go."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    except OSError as exc:
        assert exc.errno in (errno.ENXIO, errno.ENOENT), exc


class Loop:
    """evald's loop on a thread of its own (sqlite wants every call on one thread); each call must return
    within BOUND_S, or the FIFO is released and the test fails naming the call."""

    def __init__(self, fifo: Path) -> None:
        self.fifo = fifo
        self.jobs: "queue.Queue[tuple[Callable[[], object], dict] | None]" = queue.Queue()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while (job := self.jobs.get()) is not None:
            fn, done = job
            try:
                done["value"] = fn()
            except BaseException as exc:  # noqa: BLE001 - handed to the test
                done["error"] = exc
            done["event"].set()

    def call(self, fn: Callable[[], object], what: str) -> object:
        done: dict = {"event": threading.Event()}
        self.jobs.put((fn, done))
        if not done["event"].wait(BOUND_S):
            _release(self.fifo)
            done["event"].wait(BOUND_S)
            raise AssertionError(f"{what} blocked the loop for more than {BOUND_S}s with a FIFO at {self.fifo}")
        if "error" in done:
            raise done["error"]
        return done.get("value")

    def stop(self) -> None:
        self.jobs.put(None)


def _turn_until(loop: Loop, server: Server, predicate: Callable[[], bool], what: str, turns: int = 300) -> None:
    for turn in range(turns):
        assert loop.call(server.on_tick, f"turn {turn}"), f"the loop stopped before {what}"
        if loop.call(predicate, "reading the ledger"):
            return
    raise AssertionError(f"not reached in {turns} turns: {what}")


@pytest.mark.parametrize("carrier,where,when,outcome", CASES,
                         ids=[f"{when}:{where}" for _, where, when, _ in CASES])
def test_a_fifo_at_any_path_evald_reads_never_blocks_the_loop(tmp_path, sockets, carrier, where, when, outcome):
    ckpt = stage(tmp_path / "ckpt")                                    # RUN.json of the run
    if carrier is not None:
        carrier(ckpt)
    fifo = ckpt / where
    if when == "start":
        _fifo(fifo)
    tuning = dataclasses.replace(EvaldConfig().tuning, foreign_settle_s=0.0, rescan_interval_s=0.5)
    pipeline = LoaderPipeline((lambda: _fifo(fifo)) if when == "load" else None)
    server = Server(config(tmp_path, None, ckpt_dir=str(ckpt), idle_exit_s=None, tuning=tuning), pipeline=pipeline)
    loop = Loop(fifo)
    try:
        loop.call(server.startup, "the start-up (its first rescan reads the directory)")
        ledger = server.run.ledger

        def subject_settled() -> bool:
            if outcome == REJECTS:
                return ledger.file_status(where) is not None
            row = ledger.step(SUBJECT_STEP)
            return row is not None and row.state in (FAILED, EVALUATED)

        if outcome == DEFERS:
            for turn in range(20):
                assert loop.call(server.on_tick, f"turn {turn}")
            assert loop.call(lambda: ledger.step(SUBJECT_STEP), "reading the ledger") is None
        else:
            _turn_until(loop, server, subject_settled, f"step {SUBJECT_STEP} judged")
            row = loop.call(lambda: ledger.step(SUBJECT_STEP), "reading the ledger")
            files = {name: (status, reason) for name, _, status, reason in loop.call(ledger.files, "the ledger")}
            if outcome == REJECTS:
                status, reason = files[where]
                assert status == REJECTED and "FIFO" in reason, files
            elif outcome == FAILS:
                assert row.state == FAILED and ("FIFO" in row.reason or "not a regular file" in row.reason), row
            else:
                assert row.state == EVALUATED and pipeline.evaluated == [SUBJECT_STEP], row
        # a good checkpoint written afterwards is still found and evaluated
        layout.write_checkpoint(ckpt, GOOD_STEP, {"w": np.full(4, 20.0, np.float32)}, run_id=RUN_ID)
        _turn_until(loop, server, lambda: ledger.step(GOOD_STEP) is not None
                    and ledger.step(GOOD_STEP).state == EVALUATED, f"step {GOOD_STEP} evaluated")
        assert pipeline.evaluated[-1] == GOOD_STEP
        assert os.path.exists(fifo) and not os.path.isfile(fifo)      # the FIFO is still there, never opened
    finally:
        loop.call(server.shutdown, "the shutdown")
        loop.stop()


def test_every_kind_of_entry_evald_reads_is_covered():
    """The cases above reach every reader: the run's own files, evald's layout (whole and parts), foreign
    files, MindFormers' legacy layout and Checkpoint 2.0, both at the intake and at the read."""
    carriers = {c for c, _, _, _ in CASES}
    assert {None, _evald_step, _parts, _mindformers} <= carriers
    assert {w for _, w, _, _ in CASES} >= {layout.RUN_FILE, layout.RUN_END_FILE,
                                           "checkpoint/latest_checkpointed_iteration.txt", f"{ITER}/common.json",
                                           f"{ITER}/metadata.json"}
    assert {when for _, _, when, _ in CASES} == {"start", "load"}
    assert wire.RunAnnounced  # the announcement stage() writes is the run's RUN.json
