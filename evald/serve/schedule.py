"""Which queued job runs now, on the weights evald's main thread holds; only the main thread calls this.

``Runner.run(budget_s, may_swap)`` takes the waiting jobs and, in order, runs each one whose weights
are in the network, together with the later waiting jobs the same weights answer (up to one forward
pass of rows: a row's result does not depend on the others'), until ``budget_s`` has passed (at
least one pass runs, so requests are never starved either). Between two evaluation batches ``may_swap`` is False: only the checkpoint under evaluation can
answer, and the evaluation's weights are never touched. Between evaluations it is True: a pinned
``RUN@STEP`` that is not in the network is swapped in first (proven like any swap), then served; the
next evaluation swaps its own checkpoint in as always.

* ``RUN@latest``: the newest checkpoint in the network, i.e. the step held now if it is at least the
  newest evaluated step (during an evaluation that is the step being evaluated, its swap proven);
  otherwise (the network holds an older step, pinned or backfilled) the newest evaluated step is
  swapped in between evaluations. Before any checkpoint is in the network, requests wait.
* ``RUN@STEP``: served from that step only: at once when it is held, else after a swap between
  evaluations. A step that is not servable (not evaluated, or deleted) is refused with 404.

A swap happens only here, between two jobs, and each job checks that the weights it started with are
the weights it ended with, so no answer mixes two snapshots (tests/unit/serve/test_swaps_under_load.py).

May import: pipeline (Held, the scorer), serve.engine, serve.jobs, serve.requests, serve.responses.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from evald.pipeline.network import Held
from evald.pipeline.suites.scoring import TokenScorer
from evald.pipeline.suites.tokenizer import Tokenizer
from evald.serve import engine
from evald.serve.jobs import Job, JobQueue, ServeStats
from evald.serve.requests import BadRequest, Completion
from evald.serve.responses import Served

log = logging.getLogger("evald.serve")


@dataclass(frozen=True)
class Catalog:
    """What the HTTP thread may know, published whole by the main thread: servable steps, what is held."""

    run: str
    steps: tuple[int, ...] = ()        # evaluated and still on disk
    held: Served | None = None

    @property
    def newest(self) -> int | None:
        return self.steps[-1] if self.steps else None


@dataclass(frozen=True)
class Answer:
    request: Completion
    choices: list[engine.Choice]
    served: Served


class MixedWeights(RuntimeError):
    """The network's weights changed while a job ran: a bug; the answer is withheld."""


class Runner:
    def __init__(self, queue: JobQueue, stats: ServeStats, *, run: str, tokenizer: Tokenizer,
                 scorer: Callable[[], TokenScorer | None], held: Callable[[], Held | None],
                 swap: Callable[[int], Held], servable: Callable[[], tuple[int, ...]]) -> None:
        self.queue, self.stats, self.run_name, self.tokenizer = queue, stats, run, tokenizer
        self._scorer, self._held, self._swap, self._servable = scorer, held, swap, servable
        self._lock = threading.Lock()
        self._catalog = Catalog(run)

    # -- the HTTP thread reads this ---------------------------------------------------------------
    @property
    def catalog(self) -> Catalog:
        with self._lock:
            return self._catalog

    def publish(self) -> Catalog:
        """Refresh the catalog from the ledger's view and the network (main thread)."""
        held = self._held()
        catalog = Catalog(self.run_name, tuple(sorted(self._servable())),
                          Served(self.run_name, held.step, held.digest) if held is not None else None)
        with self._lock:
            self._catalog = catalog
        return catalog

    # -- the main thread runs jobs ----------------------------------------------------------------
    def run(self, budget_s: float, may_swap: bool) -> int:
        """Run waiting jobs for up to ``budget_s`` (at least one pass); the number run."""
        if not self.queue.pending():
            return 0
        started = time.monotonic()
        pending, waiting, done = self.queue.take(), [], 0
        catalog = self.publish()
        while pending:
            job = pending.pop(0)
            if job.future.cancelled():
                continue
            if done and time.monotonic() - started >= budget_s:
                waiting += [job] + pending
                break
            step = self._target(job.request, catalog, may_swap)
            if step is None:
                waiting.append(job)
                continue
            held = self._held()
            if (held is None or held.step != step) and step not in catalog.steps:
                self._fail(job, self._not_servable(step, catalog))
                continue
            if held is None or held.step != step:
                try:
                    self._swap(step)
                    self.stats.swaps += 1
                except Exception as exc:  # noqa: BLE001 - a bad or deleted checkpoint fails this job, not evald
                    log.warning("serving step %d: swapping it in failed: %s", step, exc)
                    self._fail(job, BadRequest(410, f"step {step} could not be loaded: {exc}"))
                    catalog = self.publish()
                    continue
                catalog = self.publish()
            group = [job] + self._companions(pending, step, catalog, job)
            done += self._execute(group)
        self.queue.defer([j for j in waiting if not j.future.cancelled()])
        return done

    def _companions(self, pending: list[Job], step: int, catalog: Catalog, first: Job) -> list[Job]:
        """Later jobs the same weights answer, taken out of ``pending`` to share the first one's forward
        passes, up to one pass of rows (a row's result does not depend on the others')."""
        scorer = self._scorer()
        room = (scorer.batch_size if scorer is not None else 1) - len(first.request.prompts) * first.request.n
        taken = []
        for job in list(pending):
            rows = len(job.request.prompts) * job.request.n
            if room <= 0:
                break
            if rows <= room and not job.future.cancelled() and self._target(job.request, catalog, False) == step:
                pending.remove(job)
                taken.append(job)
                room -= rows
        return taken
    def _target(self, request: Completion, catalog: Catalog, may_swap: bool) -> int | None:
        """The step to run ``request`` on now, or None to wait; BadRequest(404) is set on the job by _execute."""
        held = catalog.held
        wanted = request.model.step
        if wanted is None:
            if held is not None and (catalog.newest is None or held.step >= catalog.newest):
                return held.step
            return catalog.newest if may_swap and catalog.newest is not None else None
        if held is not None and held.step == wanted:
            return wanted
        if wanted not in catalog.steps:
            return wanted  # refused by run(): not servable
        return wanted if may_swap else None

    @staticmethod
    def _not_servable(step: int, catalog: Catalog) -> BadRequest:
        return BadRequest(404, f"step {step} cannot be served: servable steps (evaluated and still on disk) are "
                               f"{list(catalog.steps[-20:])}; GET /v1/models lists them", "model")

    def _execute(self, group: list[Job]) -> int:
        """Run ``group`` (jobs for the weights held now) in shared forward passes; the number answered."""
        scorer = self._scorer()
        before = self._held()
        runnable = []
        for job in group:
            request: Completion = job.request
            if before is None or scorer is None:
                self._fail(job, BadRequest(503, "no checkpoint is in the network (a swap failed); try again"))
            elif request.model.step is not None and request.model.step != before.step:
                self._fail(job, self._not_servable(request.model.step, self.catalog))
            elif job.future.set_running_or_notify_cancel():
                runnable.append(job)
        if not runnable:
            return 0
        assert before is not None and scorer is not None
        started = time.monotonic()
        try:
            answers = engine.run_many(scorer, self.tokenizer, [job.request for job in runnable])
            after = self._held()
            if after is None or after != before:
                raise MixedWeights(f"the weights changed while a request ran ({before} -> {after})")
        except Exception as exc:  # noqa: BLE001 - one request's failure is its answer, never evald's crash
            if len(runnable) > 1:   # find which request it was: each alone
                return sum(self._run_alone(job, scorer, before) for job in runnable)
            self._failed(runnable[0], exc)
            return 1
        ran = time.monotonic() - started
        served = Served(self.run_name, before.step, before.digest)
        for job, choices in zip(runnable, answers):
            self.stats.ran(started - job.queued_at, ran / len(runnable), job.request.prompt_tokens,
                           engine.tokens_out(choices))
            job.future.set_result(Answer(job.request, choices, served))
        return len(runnable)

    def _run_alone(self, job: Job, scorer: TokenScorer, before: Held) -> int:
        started = time.monotonic()
        try:
            choices = engine.run(scorer, self.tokenizer, job.request)
            if self._held() != before:
                raise MixedWeights(f"the weights changed while a request ran ({before} -> {self._held()})")
        except Exception as exc:  # noqa: BLE001 - as above
            self._failed(job, exc)
            return 1
        self.stats.ran(started - job.queued_at, time.monotonic() - started, job.request.prompt_tokens,
                       engine.tokens_out(choices))
        job.future.set_result(Answer(job.request, choices, Served(self.run_name, before.step, before.digest)))
        return 1

    def _failed(self, job: Job, exc: Exception) -> None:
        """A running job's error as its answer: 400 for what the scorer refuses, 500 for anything else."""
        if isinstance(exc, ValueError) and not isinstance(exc, MixedWeights):
            job.future.set_exception(BadRequest(400, str(exc)))
            return
        log.error("a served request failed", exc_info=exc)
        job.future.set_exception(BadRequest(500, f"the request failed in evald: {exc!r}"))

    def _fail(self, job: Job, error: BadRequest) -> None:
        if job.future.set_running_or_notify_cancel():
            job.future.set_exception(error)   # the HTTP handler counts it


def describe(stats: dict[str, Any]) -> str:
    return (f"{stats['served']:.0f} served, {stats['refused']:.0f} refused, {stats['busy']:.0f} busy (429), "
            f"wait mean {stats['wait_s_mean']:.3f}s max {stats['wait_s_max']:.3f}s")
