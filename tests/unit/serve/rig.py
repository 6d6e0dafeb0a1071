"""A served network in one process: the real TokenScorer, Runner, Starlette app and uvicorn thread.

The weights are in-memory snapshots put into the real network's parameter memory with
``NetworkWeights.assign`` (the same in-place path a hot swap takes), which lets a unit test swap
hundreds of times; the e2e tests (tests/e2e/test_serve.py) swap real checkpoint files in evald.
``Rig.serve`` is what evald's main thread does: run queued jobs, and swap between them; ``Loop`` runs it
in a thread until stopped.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from evald.config import ServeOptions
from evald.pipeline.swap.hot_swap import NetworkWeights
from evald.pipeline.network import Held
from evald.pipeline.suites.scoring import TokenScorer
from evald.pipeline.suites.tokenizer import ByteTokenizer
from evald.serve.app import Context, build_app
from evald.serve.http_thread import HttpThread
from evald.serve.jobs import JobQueue, ServeStats
from evald.serve.schedule import Runner


def snapshot(network, seed: int) -> dict[str, np.ndarray]:
    """The network's weights, each perturbed by a seeded noise: one 'checkpoint'."""
    rng = np.random.default_rng(seed)
    return {name: (p.asnumpy() + rng.normal(0, 0.02, p.shape).astype(p.asnumpy().dtype))
            for name, p in network.parameters_and_names()}


def digest_of(weights: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for name in sorted(weights):
        h.update(name.encode())
        h.update(np.ascontiguousarray(weights[name]).tobytes())
    return h.hexdigest()


@dataclass
class Rig:
    network: object
    options: ServeOptions
    snapshots: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)
    run: str = "unit"
    servable_override: tuple[int, ...] | None = None   # what the ledger would call servable, when not the snapshots

    def __post_init__(self) -> None:
        self.weights = NetworkWeights(self.network)
        self.tokenizer = ByteTokenizer()
        self.scorer = TokenScorer(self.network, batch_size=self.options.batch_size, top_k=self.options.sample_top_k,
                                  fork_contexts=False)   # as evald.daemon.serving builds it
        self.scorer.warm_up(generate=False, top_decoding=True)   # as evald.daemon.serving does
        self.digests = {step: digest_of(w) for step, w in self.snapshots.items()}
        self._held: Held | None = None
        self.swaps = 0
        self.woken = threading.Event()
        self.queue = JobQueue(self.options.queue_size, self.woken.set)
        self.stats = ServeStats()
        self.runner = Runner(self.queue, self.stats, run=self.run, tokenizer=self.tokenizer,
                             scorer=lambda: self.scorer, held=lambda: self._held, swap=self.swap,
                             servable=self.servable)
        self.context = Context(self.options, self.tokenizer, self.queue, self.stats, self.runner,
                               window=self.scorer.max_length)
        self.http = HttpThread(build_app(self.context), "127.0.0.1", 0, keep_alive_s=self.options.keep_alive_s,
                               limit_concurrency=self.options.limit_concurrency,
                               header_timeout_s=self.options.header_timeout_s)
        self.http.start()

    @property
    def url(self) -> str:
        return self.http.url

    def servable(self) -> tuple[int, ...]:
        return tuple(sorted(self.snapshots)) if self.servable_override is None else self.servable_override

    def drop(self) -> None:
        """Nothing proven in the network: before any swap, or after an evaluation that failed."""
        self._held = None

    def swap(self, step: int) -> Held:
        self._held = None
        self.weights.assign({k: v.copy() for k, v in self.snapshots[step].items()})
        self._held = Held(step, self.digests[step], Path(f"step_{step}"))
        self.swaps += 1
        return self._held

    def serve(self, may_swap: bool = True, budget_s: float = 0.05) -> int:
        self.runner.publish()
        return self.runner.run(budget_s, may_swap)

    def close(self) -> None:
        self.http.stop()


class Pipeline:
    """What Serving needs of evald's pipeline: the compiled network and the checkpoint it holds."""

    tensor_parallel = False

    def __init__(self, network) -> None:
        self.network = network

    def held(self) -> Held:
        return Held(10, "d" * 64, Path("step_10"))

    def group_scorer(self, scorer):
        return scorer


class Loop:
    """evald's main thread in miniature: serve queued jobs (swapping between them) until stopped."""

    def __init__(self, rig: Rig, may_swap: bool = True) -> None:
        self.rig, self.may_swap, self.stop = rig, may_swap, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            if not self.rig.serve(self.may_swap):
                self.rig.woken.wait(0.01)
                self.rig.woken.clear()

    def __enter__(self) -> "Loop":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(10)


def until_ready(serving) -> int:
    """evald's loop turns (``Serving.on_tick``) until the serving scorer's graphs are compiled, one a turn;
    how many turns it took."""
    ticks = 0
    while True:
        serving.on_tick()
        ticks += 1
        if not serving.pending():
            return ticks
