"""Which queued job runs now, on the weights evald's main thread holds; only the main thread calls this.

``Runner.run(budget_s, may_swap)`` takes the waiting jobs and, in order, runs a slice of each one whose
weights are in the network: at most ``serve.batch_size`` rows (prompts x ``n``), the job's next rows
together with those of later waiting jobs the same weights answer (a row's result does not depend on
the others'), until ``budget_s`` has passed (at least one slice runs, so requests are never starved
either). A job whose rows are not all run yet stays first in line; it finishes on the weights it
started on (or starts over on the step it asked for when those changed), so no answer mixes two
snapshots. Between two evaluation batches ``may_swap`` is False: only the checkpoint under evaluation
can answer, and the evaluation's weights are never touched; with ``budget_s`` 0 one slice runs there,
so a batch waits for one slice at most. Between evaluations it is True: a pinned ``RUN@STEP`` that is
not in the network is swapped in first (proven like any swap), then served; the next evaluation swaps
its own checkpoint in as always.

* ``RUN@latest``: the newest checkpoint in the network, i.e. the step held now if it is at least the
  newest evaluated step (during an evaluation that is the step being evaluated, its swap proven);
  otherwise (the network holds an older step, pinned or backfilled) the newest evaluated step is
  swapped in between evaluations. Before any checkpoint is in the network, requests wait.
* ``RUN@STEP``: served from that step only: at once when it is held, else after a swap between
  evaluations. A step that is not servable (not evaluated, or deleted) is refused with 404.

A swap happens only here, between two slices, and each slice checks that the weights it started with
are the weights it ended with (tests/unit/serve/test_swaps_under_load.py). Weights that give
non-finite log-probabilities answer a JSON error naming the step (500), never a number.

May import: pipeline (Held, the scorer), serve.engine, serve.jobs, serve.requests, serve.responses.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from evald.pipeline.network import Held
from evald.pipeline.engine import TokenScorer
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


@dataclass
class Progress:
    """A job whose rows are run in slices: its rows, the weights its first slice ran on, its run time."""

    rows: list[engine.Row]
    held: Held
    started: float
    run_s: float = 0.0
    next: int = 0          # rows[:next] have run

    @property
    def finished(self) -> bool:
        return self.next >= len(self.rows)


class Runner:
    def __init__(self, queue: JobQueue, stats: ServeStats, *, run: str, tokenizer: Tokenizer,
                 scorer: Callable[[], TokenScorer | None], held: Callable[[], Held | None],
                 swap: Callable[[int], Held], servable: Callable[[], tuple[int, ...]]) -> None:
        self.queue, self.stats, self.run_name, self.tokenizer = queue, stats, run, tokenizer
        self._scorer, self._held, self._swap, self._servable = scorer, held, swap, servable
        self._lock = threading.Lock()
        self._catalog = Catalog(run)
        self._progress: dict[Job, Progress] = {}

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
        """Run slices of waiting jobs for up to ``budget_s`` (at least one slice); the number of rows run."""
        if not self.queue.pending():
            return 0
        started = time.monotonic()
        pending, waiting, rows_run = self.queue.take(), [], 0
        catalog = self.publish()
        while pending:
            job = pending.pop(0)
            if job.future.cancelled():
                self._progress.pop(job, None)
                continue
            if rows_run and time.monotonic() - started >= budget_s:
                waiting += [job] + pending
                break
            step = self._step_for(job, catalog, may_swap)
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
            ran, unfinished = self._slice(group)
            rows_run += ran
            pending[:0] = unfinished   # first in line: the next slice, now if the budget allows
        self.queue.defer([j for j in waiting if not j.future.cancelled()])
        return rows_run

    def _step_for(self, job: Job, catalog: Catalog, may_swap: bool) -> int | None:
        """The step ``job`` runs on now, or None to wait: a started job's own step, else its target."""
        progress = self._progress.get(job)
        if progress is not None:
            step = progress.held.step
            if catalog.held is not None and catalog.held.step == step:
                return step
            if step in catalog.steps:
                return step if may_swap else None
            del self._progress[job]   # its step is gone: start over (a pinned request is refused, 404)
        return self._target(job.request, catalog, may_swap)

    def _remaining(self, job: Job) -> int:
        progress = self._progress.get(job)
        total = len(job.request.prompts) * job.request.n
        return total - progress.next if progress is not None else total

    def _companions(self, pending: list[Job], step: int, catalog: Catalog, first: Job) -> list[Job]:
        """Later jobs the same weights answer, taken out of ``pending`` to share the first one's slice,
        up to one pass of rows (a row's result does not depend on the others')."""
        scorer = self._scorer()
        room = (scorer.batch_size if scorer is not None else 1) - self._remaining(first)
        taken = []
        for job in list(pending):
            if room <= 0:
                break
            if not job.future.cancelled() and self._step_for(job, catalog, False) == step:
                pending.remove(job)
                taken.append(job)
                room -= self._remaining(job)
        return taken

    def _target(self, request: Completion, catalog: Catalog, may_swap: bool) -> int | None:
        """The step to run ``request`` on now, or None to wait; BadRequest(404) is set on the job by run()."""
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

    def _slice(self, group: list[Job]) -> tuple[int, list[Job]]:
        """One slice of ``group`` (jobs for the weights held now): at most batch_size rows, the first job's
        next rows first. (rows run, jobs with rows left)."""
        scorer = self._scorer()
        before = self._held()
        chosen: list[tuple[Job, Progress, list[engine.Row]]] = []
        later: list[Job] = []   # no room left in this slice: first in line for the next
        room = scorer.batch_size if scorer is not None else 0
        for job in group:
            request: Completion = job.request
            progress = self._progress.get(job)
            if before is None or scorer is None:
                self._fail(job, BadRequest(503, "no checkpoint is in the network (a swap failed); try again"))
                continue
            if request.model.step is not None and request.model.step != before.step:
                self._fail(job, self._not_servable(request.model.step, self.catalog))
                continue
            if progress is not None and progress.held != before:
                progress = None   # other weights (the step was re-written): start over, on these
            if progress is None:
                if not job.future.running() and not job.future.set_running_or_notify_cancel():
                    continue   # the client gave up before it started
                progress = self._progress[job] = Progress(engine.rows_of(request), before, time.monotonic())
            if room <= 0:
                later.append(job)
                continue
            rows = progress.rows[progress.next:progress.next + room]
            room -= len(rows)
            chosen.append((job, progress, rows))
        if not chosen:
            return 0, later
        assert before is not None and scorer is not None
        started = time.monotonic()
        failed: dict[Job, Exception] = {}
        try:
            self._run_rows(scorer, [row for _, _, rows in chosen for row in rows], before)
        except Exception:  # noqa: BLE001 - one request's failure is its answer: find whose, each alone
            for job, progress, rows in chosen:
                progress.rows[progress.next:progress.next + len(rows)] = rows = self._fresh(job, progress, rows)
                try:
                    self._run_rows(scorer, rows, before)
                except Exception as exc:  # noqa: BLE001 - as above
                    failed[job] = exc
        ran = time.monotonic() - started
        served = Served(self.run_name, before.step, before.digest)
        unfinished = []
        for job, progress, rows in chosen:
            if job in failed:
                self._progress.pop(job, None)
                self._failed(job, failed[job], before.step)
                continue
            progress.next += len(rows)
            progress.run_s += ran / len(chosen)
            if not progress.finished:
                unfinished.append(job)
                continue
            del self._progress[job]
            choices = [row.choice for row in progress.rows]
            self.stats.ran(progress.started - job.queued_at, progress.run_s, job.request.prompt_tokens,
                           engine.tokens_out(choices))
            job.future.set_result(Answer(job.request, choices, served))
        return sum(len(rows) for _, _, rows in chosen), unfinished + later

    def _run_rows(self, scorer: TokenScorer, rows: list[engine.Row], before: Held) -> None:
        engine.run_rows(scorer, self.tokenizer, rows)
        after = self._held()
        if after is None or after != before:
            raise MixedWeights(f"the weights changed while a request ran ({before} -> {after})")

    @staticmethod
    def _fresh(job: Job, progress: Progress, rows: list[engine.Row]) -> list[engine.Row]:
        """``rows`` as they were before a failed shared run (they are run again, alone)."""
        first = progress.next
        return engine.rows_of(job.request)[first:first + len(rows)]

    def _failed(self, job: Job, exc: Exception, step: int) -> None:
        """A running job's error as its answer: 400 for what the scorer refuses, a JSON 500 for broken
        weights and anything else."""
        if isinstance(exc, engine.NonFinite):
            log.error("serving step %d: %s", step, exc)
            job.future.set_exception(BadRequest(500, f"step {step}: {exc}; its weights are broken, ask another "
                                                     f"step (GET /v1/models)", "model"))
            return
        if isinstance(exc, ValueError) and not isinstance(exc, MixedWeights):
            job.future.set_exception(BadRequest(400, str(exc)))
            return
        log.error("a served request failed", exc_info=exc)
        job.future.set_exception(BadRequest(500, f"the request failed in evald: {exc!r}"))

    def _fail(self, job: Job, error: BadRequest) -> None:
        self._progress.pop(job, None)
        if job.future.running() or job.future.set_running_or_notify_cancel():
            job.future.set_exception(error)   # the HTTP handler counts it


def describe(stats: dict[str, Any]) -> str:
    return (f"{stats['served']:.0f} served, {stats['refused']:.0f} refused, {stats['busy']:.0f} busy (429), "
            f"wait mean {stats['wait_s_mean']:.3f}s max {stats['wait_s_max']:.3f}s")
