"""Wire the HTTP endpoint (evald.serve) into evald's loop: start it, feed it the network, run its jobs.

``Serving`` is built by the Server at start-up when ``--serve`` / ``[serve] listen`` is set: it reads the
bearer token (refusing a token file others can read), binds the address and starts uvicorn's thread.
Then, on evald's main thread:

* ``between_batches()`` (from the pipeline's ``should_abort``, between two evaluation batches) runs
  queued jobs for the step under evaluation for at most ``serve.budget_s``, never swapping;
* ``on_tick()`` (each loop turn) builds the scorer once the network exists (its buckets compiled
  at once; its window is ``serve.max_length``, else the network's max_length-like attribute, else the
  suites' ``max_length``, the smallest; without any, or when the scorer cannot be built, one ERROR says
  what to set, requests get 503 saying it and evaluation goes on), refreshes the servable steps (evaluated and still on disk), runs queued jobs for at most
  ``serve.budget_s`` (swapping in a pinned or the newest step if needed), and writes a ``serve/*``
  TensorBoard record and ``evald status``'s numbers every ``serve.report_every_s`` (one ledger
  transaction each, never one per request).

Eval group: requests run on rank 0's network (the Pipeline's ``network``), the other ranks are not
involved; an evaluation's batches on rank 0 wait at most ``serve.budget_s`` for them. A tensor-parallel
group's rank 0 holds one shard: every forward of a request is a command to the whole group (the
Pipeline's ``group_scorer``), so requests run between evaluations only, never between the batches of one
(the other ranks are inside that evaluation's collectives).

May import: config, ledger, pipeline, serve.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from evald.config import EvaldConfig
from evald.contracts.partition import source_exists
from evald.ledger.ledger import EVALUATED, Ledger, Record
from evald.pipeline.network import Held
from evald.pipeline.pipeline import ServablePipeline
from evald.pipeline.engine import TokenScorer, model_max_length
from evald.pipeline.suites.tokenizer import Tokenizer, build_tokenizer
from evald.serve.app import Context, build_app
from evald.serve.http_thread import HttpThread, ServeError
from evald.serve.jobs import JobQueue, ServeStats
from evald.serve.requests import MAX_LOGPROBS
from evald.serve.schedule import Runner, describe
from evald.serve.token import TokenFileError, read_token

log = logging.getLogger("evald.serve")
WAKE = "serve-wake"         # the event-queue item a new request puts there, so an idle loop turns at once
SERVE_STATE = "serve"       # ledger key of the numbers `evald status` shows
SERVE_FILE = "serve.json"   # RUN_DIR/serve.json: the URL (with the port evald got for port 0)
STEPS_REFRESH_S = 0.5


def tokenizer_of(config: EvaldConfig) -> Tokenizer:
    """The tokenizer factory's tokenizer where the configuration has one (--tokenizer-factory), else bytes."""
    from evald.config import factory_spec

    return build_tokenizer(factory_spec(config, "tokenizer"))


@dataclass
class _Warming:
    """The serving scorer while its graphs are compiled, one per loop turn."""
    scorer: Any
    local: TokenScorer
    window: tuple[int, str]
    steps: Iterator[int]
    started: float


class Serving:
    def __init__(self, config: EvaldConfig, pipeline: ServablePipeline,
                 events: "queue.Queue[tuple[str, Any]]") -> None:
        options = config.serve
        self.options, self.pipeline = options, pipeline
        try:
            token = read_token(options.token_file) if options.token_file else None
        except TokenFileError as exc:
            raise ServeError(str(exc)) from None
        self.tokenizer = tokenizer_of(config)

        self._woken = threading.Event()

        def wake() -> None:  # one wake-up item at a time, however many requests arrive
            if self._woken.is_set():
                return
            self._woken.set()
            try:
                events.put_nowait((WAKE, None))
            except queue.Full:
                pass

        self.queue = JobQueue(options.queue_size, wake)
        self.stats = ServeStats()
        self.scorer: TokenScorer | None = None
        self._scored_network: Any = None
        self._warming: _Warming | None = None   # the scorer whose graphs are being compiled, one per turn
        self._window_sources = {"serve.max_length": options.max_length, "the suites' max_length": min(
            (suite.max_length for suite in (config.suites or {}).values() if suite.max_length), default=None)}
        self.ledger: Ledger | None = None
        self.ckpt_dir: Path | None = None
        self.run_dir: Path | None = None
        self._stopped = False
        self._steps: tuple[int, ...] = ()
        self._steps_at = 0.0
        self.runner = Runner(self.queue, self.stats, run="evald", tokenizer=self.tokenizer,
                             scorer=lambda: self.scorer, held=self._held, swap=self._swap,
                             servable=lambda: self._steps)
        self.context = Context(options, self.tokenizer, self.queue, self.stats, self.runner, token=token)
        host, _, port = options.listen.rpartition(":")
        self.http = HttpThread(build_app(self.context), host.strip("[]"), int(port),
                               keep_alive_s=options.keep_alive_s, limit_concurrency=options.limit_concurrency,
                               header_timeout_s=options.header_timeout_s, beyond_loopback=token is not None)
        self._seq = 0
        self._reported_at = time.monotonic()
        self._reported: dict[str, float] | None = None

    def start(self) -> None:
        self.http.start()

    def attach(self, run_name: str, run_dir: Path, ckpt_dir: Path, ledger: Ledger) -> None:
        self.runner.run_name, self.ledger, self.ckpt_dir, self.run_dir = run_name, ledger, ckpt_dir, run_dir
        state = ledger.get_state(SERVE_STATE, {}) or {}
        self._seq = int(state.get("seq", 0))
        path = run_dir / SERVE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"url": self.http.url, "pid": os.getpid(), "model": f"{run_name}@latest"}))
        os.replace(tmp, path)
        log.info("serving run %r at %s/v1 (model %s@latest or %s@STEP)", run_name, self.http.url, run_name, run_name)

    # -- what the runner needs --------------------------------------------------------------------
    def _held(self) -> Held | None:
        return self.pipeline.held()

    def _swap(self, step: int) -> Held:
        assert self.ledger is not None and self.ckpt_dir is not None
        row = self.ledger.step(step)
        if row is None or row.state != EVALUATED:
            raise ValueError(f"step {step} is not an evaluated step of this run")
        return self.pipeline.swap_in(self.ckpt_dir, row)

    def steps_changed(self) -> None:
        """An evaluation ended: read the servable steps afresh at the next turn."""
        self._steps_at = 0.0

    def _refresh_steps(self, force: bool = False) -> None:
        if self.ledger is None or self.ckpt_dir is None:
            return
        now = time.monotonic()
        if force or now - self._steps_at >= STEPS_REFRESH_S:
            self._steps_at = now
            self._steps = tuple(row.step for row in self.ledger.steps(EVALUATED)
                                if source_exists(self.ckpt_dir, row.source))

    def window_of(self, network: Any) -> tuple[int, str] | None:
        """The served window and where it comes from: serve.max_length, the network's attribute, the suites'."""
        if self._window_sources["serve.max_length"]:
            return self._window_sources["serve.max_length"], "serve.max_length"
        own = model_max_length(network)
        if own:
            return own, f"the {type(network).__name__} network's own attribute"
        suites = self._window_sources["the suites' max_length"]
        return (suites, "the suites' max_length") if suites else None

    def _ensure_scorer(self) -> None:
        """The scorer for the network: made once per network, its graphs compiled one per loop turn (seconds
        each at LLM shapes; 27 at a window of 512 with cached decoding), so that a checkpoint committed
        meanwhile is validated between two of them; requests wait (``/health`` not ok) until all are."""
        if self._warming is not None:
            self._warm_next()
            return
        network = self.pipeline.network
        if network is None or network is self._scored_network:
            return
        self._scored_network = network   # tried once per network: a failure is said once, not every turn
        self.scorer, self.context.window, self.context.unavailable = None, None, None
        window = self.window_of(network)
        if window is None:
            self._unavailable(f"serving is off: evald cannot tell the window of the {type(network).__name__} "
                              f"network (it has no max_length, seq_length, seq_len or max_position_embeddings "
                              f"attribute); set serve.max_length (e.g. --serve '{{\"listen\": "
                              f"\"{self.options.listen}\", \"max_length\": 2048}}') or a suite's max_length, "
                              f"and start evald again. Checkpoints are still evaluated")
            return
        try:
            local = TokenScorer(network, max_length=window[0], batch_size=self.options.batch_size,
                                top_k=max(self.options.sample_top_k, MAX_LOGPROBS),
                                fork_contexts=False)   # a completion is one row; forks would only add graphs
            scorer = self.pipeline.group_scorer(local)
        except Exception as exc:  # noqa: BLE001 - serving is off, evaluation goes on
            self._scorer_failed(exc, window)
            return
        # every graph compiled before the first request, never at a request or a swap
        self._warming = _Warming(scorer, local, window, scorer.warming(generate=False, top_decoding=True),
                                 time.monotonic())

    def _warm_next(self) -> None:
        warming = self._warming
        assert warming is not None
        try:
            if next(warming.steps, None) is not None:
                return
        except Exception as exc:  # noqa: BLE001 - serving is off, evaluation goes on
            self._warming = None
            self._scorer_failed(exc, warming.window)
            return
        self._warming = None
        scorer, local, window = warming.scorer, warming.local, warming.window
        self.scorer = scorer
        self.context.window = scorer.max_length
        log.info("serving: window %d tokens (from %s), %d graphs compiled in %.1fs (buckets %s); completions: %s",
                 scorer.max_length, window[1], scorer.compiled_graphs, time.monotonic() - warming.started,
                 list(scorer.lengths),
                 "cached (a prefill, then one token per row per step)" if scorer.decoding == "cached" else
                 "full-forward (a forward of each row per new token: " + (
                     "a tensor-parallel eval group keeps no cache)" if scorer is not local else
                     f"{type(local.network).__name__} has no init_cache/extend)" if not hasattr(local.network, "extend")
                     else f"{type(local.network).__name__}.extend failed its check at warm-up: the ERROR above)"))

    def _scorer_failed(self, exc: Exception, window: tuple[int, str]) -> None:
        log.debug("the serving scorer failed", exc_info=True)
        self._unavailable(f"serving is off: the network cannot run a window of {window[0]} tokens (from "
                          f"{window[1]}): {str(exc)[:500]}; set serve.max_length to the model's window and "
                          f"start evald again. Checkpoints are still evaluated")

    def _unavailable(self, why: str) -> None:
        self.context.unavailable = why
        log.error("%s", why)

    # -- the loop's calls ----------------------------------------------------------------------------
    def pending(self) -> bool:
        """Work for the next turn at once: queued requests, or the scorer's graphs still to compile."""
        return self.queue.pending() or self._warming is not None

    def between_batches(self) -> None:
        if self.scorer is None or not self.queue.pending() or self.pipeline.tensor_parallel:
            return
        started = time.monotonic()
        self.runner.run(self.options.budget_s, may_swap=False)
        self.stats.between_batches(time.monotonic() - started)

    def on_tick(self) -> None:
        self._woken.clear()
        self._ensure_scorer()
        self._refresh_steps()
        if self.scorer is not None:
            self.runner.run(self.options.budget_s, may_swap=True)
        self.runner.publish()
        self.report()

    def report(self, force: bool = False) -> None:
        """One serve/* record (and the status numbers) every report_every_s, when something changed."""
        if self.ledger is None:
            return
        now = time.monotonic()
        if not force and now - self._reported_at < self.options.report_every_s:
            return
        self._reported_at = now
        snap = self.stats.snapshot(self.queue.depth())
        if snap == self._reported and not self._stopped:
            return
        self._reported = snap
        self._seq += 1
        record = Record("serve", self._seq, time.time(), {f"serve/{k}": v for k, v in snap.items()}, {})
        state = dict(snap, seq=self._seq, url=self.http.url, at=time.time(), pid=os.getpid())
        if self._stopped:
            state["stopped_at"] = time.time()
        self.ledger.add_records([record], kv={SERVE_STATE: state})

    def check_alive(self) -> str | None:
        """None, or why the HTTP thread is dead."""
        return None if self.http.is_alive() else (self.http.failure() or "it stopped")

    def close(self) -> None:
        """Stop the endpoint; serve.json goes, and `evald status` says serving stopped (not a dead URL)."""
        self.http.stop()
        log.info("serving: %s", describe(self.stats.snapshot(self.queue.depth())))
        if self.run_dir is not None:
            try:
                (self.run_dir / SERVE_FILE).unlink(missing_ok=True)
            except OSError as exc:
                log.warning("serving: %s could not be removed (%s); it names a stopped endpoint",
                            self.run_dir / SERVE_FILE, exc)
        self._stopped = True
        try:
            self.report(force=True)
        except Exception:  # noqa: BLE001 - the ledger may be closed already
            log.debug("the last serve/* record was not written", exc_info=True)
