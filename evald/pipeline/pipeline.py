"""Load, verify and evaluate one checkpoint with the network compiled once.

The Pipeline owns the Evaluator: it builds it (and compiles the graph) as soon as the
model and data factories are known, from the configuration or the trainer's
announcement, not when the first checkpoint arrives. ``evaluate`` turns one step into
one of three outcomes:

* ``Evaluated``: the metrics;
* ``Failed``: the checkpoint is bad (corrupt, wrong shapes, deleted); the reason is
  recorded and the step is never retried by itself;
* ``Retry``: something unexpected raised (a bug, an OOM); the step goes back to the
  queue with its attempt counted, and evald says so loudly, because such an error
  says nothing about the checkpoint.
EvaluationInterrupted (a forced shutdown, or a signal during a read) propagates: the caller re-queues
the step, or fails it after tuning.max_attempts interruptions.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol, Union

from evald.config import EvaldConfig, factory_spec
from evald.contracts.safetensors_io import ReadInterrupted
from evald.files.recognise import CheckpointDeleted, CheckpointError
from evald.ledger.ledger import DELETED, FAILED, Step
from evald.pipeline.factories import check_allowed
from evald.pipeline.group.protocol import Group
from evald.pipeline.network import EvalResult, Evaluator, Held
from evald.pipeline.swap.provenance import EvaluationSpec
from evald.pipeline.subset import SubsetInfo
from evald.pipeline.tasks.base import EvaluationInterrupted, ShouldAbort

if TYPE_CHECKING:   # the suites' runner imports lm-eval: only when a suite is configured, not for a type
    from evald.pipeline.group.evaluator import GroupEvaluator
    from evald.pipeline.suites.runner import SuiteResult, SuiteRunner

log = logging.getLogger("evald.pipeline.pipeline")


@dataclass(frozen=True)
class Evaluated:
    result: EvalResult
    identity: str | None = None   # the validation identity that produced it (evald.ledger cells)


@dataclass(frozen=True)
class Failed:
    reason: str
    state: str = FAILED
    identity: str | None = None   # the validation identity that judged it, when it evaluated the file


@dataclass(frozen=True)
class Retry:
    reason: str


Outcome = Union[Evaluated, Failed, Retry]


class EvaluationPipeline(Protocol):
    """What the daemon needs of a pipeline: the real one below, or a test's stand-in."""

    blocked_reason: str | None
    suites: dict[str, SuiteRunner]   # name -> its runner, once built
    suite_errors: dict[str, str]     # name -> why it cannot run
    suites_pending: tuple[str, ...]  # configured suites not built yet (build_next_suite builds them)
    keep_alive: Callable[[], None]   # set by the daemon: called between the steps of building the network

    @property
    def subset(self) -> SubsetInfo | None:
        """The fixed subset of the network built, or None before one is."""

    @property
    def validation_identity(self) -> str | None:
        """The default validation's identity (sha256 of its settings), once built."""

    def evaluate_suite(self, name: str, ckpt_dir: Path, row: Step) -> SuiteOutcome: ...

    def ensure_built(self, config: EvaldConfig) -> bool: ...

    def build_next_suite(self) -> bool:
        """One piece of building a pending suite (or fail it, with its reason in suite_errors); False when none
        is pending."""

    def evaluate(self, ckpt_dir: Path, row: Step) -> Outcome: ...


class ServablePipeline(Protocol):
    """What the HTTP endpoint (evald.daemon.serving) uses of a pipeline: the network it answers with, the
    checkpoint that network holds, and a swap of another evaluated step into it between evaluations."""

    @property
    def network(self) -> Any:
        """The compiled network (a mindspore.nn.Cell), or None before one is built."""

    def held(self) -> Held | None: ...

    def swap_in(self, ckpt_dir: Path, row: Step) -> Held: ...

    @property
    def tensor_parallel(self) -> bool:
        """Whether the network is one shard of a tensor-parallel group: every forward needs every rank."""

    def group_scorer(self, scorer: Any) -> Any:
        """``scorer`` (a TokenScorer on this process's network), or, on a tensor-parallel group, one that
        runs each call on every rank."""


@dataclass(frozen=True)
class SuiteEvaluated:
    result: SuiteResult
    load_s: float                # 0 when the network already held the step's weights
    provenance: dict


SuiteOutcome = Union[SuiteEvaluated, Failed, Retry]


@dataclass(frozen=True)
class _Plugin:
    name: str
    metric: Any


class Pipeline:
    def __init__(self, should_abort: ShouldAbort, group: Group | None = None, device_selected: bool = False) -> None:
        """``device_selected``: this process has chosen its device already (an eval group's ranks do before
        init(); so does a process whose MindSpore runtime already runs kernels, where choosing fails)."""
        self.should_abort = should_abort
        # called between the steps of building the network (graphs compile for seconds each): the server sets it
        # to republish its control state, so that a trainer that connects meanwhile hears evald and its leases
        self.keep_alive: Callable[[], None] = lambda: None
        self.group = group  # an eval group's rank 0 (evald.pipeline.group.protocol.Group): every rank builds and evaluates
        self.evaluator: Evaluator | GroupEvaluator | None = None  # a group's rank 0 holds a GroupEvaluator
        self.blocked_reason: str | None = None   # why nothing can be evaluated now, when so
        self._built_specs: EvaluationSpec | None = None
        self._failed_specs: EvaluationSpec | None = None
        self._device_selected = device_selected or group is not None
        self.suites: dict[str, SuiteRunner] = {}
        self.suite_errors: dict[str, str] = {}    # name -> why the suite cannot run
        self._suites_for: Any = None              # what the suites were built for
        self._suite_plan: tuple[EvaldConfig, EvaluationSpec] | None = None  # what the pending ones are for
        self._tokenizer: Any = None               # the suites' tokenizer, built with the first of them
        self._model_vocab: int | None = None      # the network's vocabulary (its logits), measured once
        self.suites_pending: tuple[str, ...] = ()  # configured, not built yet: built between evaluations
        self._building: SuiteRunner | None = None  # the first pending suite, its graphs being compiled
        self.loaded_step: int | None = None       # the step whose weights the network holds, if proven
        self._named: tuple[Path, int] | None = None   # the path last swapped in, and its ledger step

    # -- what the HTTP endpoint serves from (evald.serve; the daemon calls these between jobs) ---------
    def _local(self) -> Evaluator | None:
        """This process's own Evaluator: a one-device evald's, or rank 0's own share in an eval group."""
        if self.evaluator is None or isinstance(self.evaluator, Evaluator):
            return self.evaluator
        return self.evaluator.local

    @property
    def network(self) -> Any:
        """This process's compiled network (rank 0's in an eval group), or None before one is built."""
        local = self._local()
        return local.network if local is not None else None

    def held(self) -> Held | None:
        """The checkpoint the network holds now, its swap proven, with its ledger step; None mid-swap."""
        local = self._local()
        held = local.held if local is not None else None
        if held is not None and self._named is not None and self._named[0] == held.path:
            return replace(held, step=self._named[1])
        return held

    @property
    def tensor_parallel(self) -> bool:
        """Whether this process's network is one shard of a tensor-parallel group (every forward, a swap
        too, is then the whole group's: a command, never rank 0 alone)."""
        local = self._local()
        return self.group is not None and local is not None and local.tensor_parallel[0] > 1

    def group_scorer(self, scorer: Any) -> Any:
        """``scorer`` (a TokenScorer on this process's network), or, on a tensor-parallel group, a GroupScorer
        that runs each of its calls on every rank (serving; a suite's scorer is made in build_next_suite)."""
        if not self.tensor_parallel:
            return scorer
        from evald.pipeline.group.scoring import GroupScorer

        return GroupScorer(self.group, scorer, tensor_parallel=True)  # type: ignore[arg-type]

    def swap_in(self, ckpt_dir: Path, row: Step) -> Held:
        """Swap ``row``'s checkpoint into this process's network, proven, without evaluating it (a pinned
        request, between evaluations; the next evaluation swaps its own checkpoint in as always). On a
        tensor-parallel group every rank swaps (a SWAP command); on a data-parallel one rank 0 alone serves."""
        local = self._local()
        if local is None:
            raise RuntimeError("no evaluation network is built yet")
        self._named, self.loaded_step = (ckpt_dir / row.source, row.step), None
        if self.tensor_parallel:
            self.evaluator.load_only(ckpt_dir / row.source, row.kind, row.step)  # type: ignore[union-attr]
        else:
            local.swap_in(ckpt_dir / row.source, row.kind, row.step)
        self.loaded_step = row.step   # a suite of this step need not swap it in again
        return self.held()  # type: ignore[return-value]

    @property
    def subset(self) -> SubsetInfo | None:
        return self.evaluator.subset if self.evaluator is not None else None

    def ensure_built(self, config: EvaldConfig) -> bool:
        """Build the evaluator for ``config``'s factories if needed; False while it cannot be built."""
        model, data = factory_spec(config, "model"), factory_spec(config, "data")
        if model is None or data is None:
            self.blocked_reason = ("no model or data factory is known: pass --model-factory and --data-factory, "
                                   "or let the trainer announce them (EvaldHook(model_factory=..., "
                                   "data_factory=...))")
            return False
        specs = EvaluationSpec(config.task or "lm", model, data, config.subset_size, config.subset_seed,
                               config.batch_size, config.generation, tuple(config.metric_plugins))
        if self.evaluator is not None and specs == self._built_specs:
            return True
        if specs == self._failed_specs:
            return False  # the same specs failed already: wait for new ones
        try:
            for spec, what in ((model, "model"), (data, "data")):
                check_allowed(spec, what, config.factory_allow)  # before anything is imported
            self._build(config, specs)
        except Exception as exc:  # a bad factory, plug-in or data must not crash-loop evald
            self.evaluator, self._failed_specs = None, specs
            self.blocked_reason = f"cannot build the evaluation network: {exc}"
            log.error("%s; checkpoints stay queued until the factories are fixed", self.blocked_reason,
                      exc_info=not isinstance(exc, (ValueError, TypeError, ImportError)))
            return False
        self._built_specs, self._failed_specs, self.blocked_reason = specs, None, None
        self._ensure_suites(config, specs)
        return True

    @property
    def validation_identity(self) -> str | None:
        """sha256 of the validation's effective config (model, data, subset, settings), once built."""
        from evald.pipeline.swap.provenance import sha256_of

        if self.evaluator is None or self._built_specs is None:
            return None
        return sha256_of(self._built_specs.identity())

    def _ensure_suites(self, config: EvaldConfig, specs: EvaluationSpec) -> None:
        """Plan the configured benchmark suites on the network (once per configuration). They are built
        later, one per call of build_next_suite, so that building them (tens of seconds each: lm-eval's
        tasks, the scorer's graphs) never delays a checkpoint's validation."""
        wanted = (dict(config.suites or {}), config.tokenizer_factory, config.tokenizer_kwargs, specs)
        if wanted == self._suites_for:
            return
        self._suites_for, self.suites, self.suite_errors = wanted, {}, {}
        self._suite_plan, self._tokenizer, self._model_vocab = (config, specs), None, None
        self.suites_pending, self._building = tuple(sorted(config.suites or {})), None

    def build_next_suite(self) -> bool:
        """One piece of building the next pending suite, False when none is pending. The pieces: the tokenizer
        (once), the suite's lm-eval tasks with the vocabulary check, then its graphs, one per call (seconds
        each at LLM shapes). A checkpoint that arrives meanwhile waits for one piece, never a whole build
        (tens of seconds). The suite is in ``suites`` once its last graph is compiled."""
        if not self.suites_pending or self._suite_plan is None or self.evaluator is None:
            return False
        config, specs = self._suite_plan
        if self._tokenizer is None and not self._build_tokenizer(config):
            return True
        name = self.suites_pending[0]
        try:
            if self._building is None or self._building.name != name:
                self._building = self._new_suite(name, config, specs)
                return True
            if not self._building.warm_next():
                return True
            self.suites[name] = self._building
        except Exception as exc:  # noqa: BLE001 - one broken suite must not stop the others
            self.suite_errors[name] = f"cannot build suite {name}: {exc}"
            log.error("%s; its queued cells wait until it is fixed", self.suite_errors[name],
                      exc_info=not isinstance(exc, (ValueError, KeyError, ImportError)))
        self._building, self.suites_pending = None, self.suites_pending[1:]
        return True

    def _new_suite(self, name: str, config: EvaldConfig, specs: EvaluationSpec) -> SuiteRunner:
        """Suite ``name``'s runner (its tasks loaded, no graph compiled yet), the tokenizer checked against the
        model's vocabulary."""
        from evald.pipeline.suites.runner import SuiteRunner
        from evald.pipeline.suites.tokenizer import check_covers

        options = config.suites[name]
        log.info("building suite %s: its tasks now, then its graphs one at a time between evaluations", name)
        network_identity = {"model": specs.model.target, "model_kwargs": dict(specs.model.kwargs), "task": specs.task}
        scorer = None
        if self.group is not None:  # the requests split over the group's ranks; lm-eval sees one
            from evald.pipeline.group.scoring import GroupScorer
            from evald.pipeline.suites.scoring import TokenScorer

            ids = config.device.ids
            wanted = {int(i) for i in options.device.split(",")} if options.device else set(ids)
            ranks = [r for r in range(self.group.size) if ids[r % len(ids)] in wanted]
            scorer = GroupScorer(self.group, TokenScorer(self.evaluator.network,  # type: ignore
                                                         max_length=options.max_length,
                                                         batch_size=options.batch_size), ranks,
                                 tensor_parallel=config.tensor_parallel > 1)
        runner = SuiteRunner(name, options, self.evaluator.network, self._tokenizer,  # type: ignore
                             network_identity=network_identity, scorer=scorer)
        if self._model_vocab is None:
            self._model_vocab = runner.scorer.vocab_size()
        check_covers(self._tokenizer, self._model_vocab)  # else plausible numbers that mean nothing
        return runner

    def _build_tokenizer(self, config: EvaldConfig) -> bool:
        """The suites' tokenizer; False (every pending suite failed, with the reason) when it cannot be built."""
        from evald.contracts.wire import FactorySpec
        from evald.pipeline.suites.tokenizer import build_tokenizer

        try:
            spec = (FactorySpec(config.tokenizer_factory, dict(config.tokenizer_kwargs or {}), config.app_dir)
                    if config.tokenizer_factory else None)
            if spec is not None:
                check_allowed(spec, "tokenizer", config.factory_allow)
            self._tokenizer = build_tokenizer(spec)
        except Exception as exc:  # noqa: BLE001 - a bad tokenizer blocks the suites, not the validation
            for name in self.suites_pending:
                self.suite_errors[name] = f"cannot build the tokenizer: {exc}"
            self.suites_pending = ()
            log.error("benchmark suites not run: cannot build the tokenizer: %s", exc)
            return False
        return True

    def evaluate_suite(self, name: str, ckpt_dir: Path, row: Step) -> SuiteOutcome:
        """Suite ``name`` on step ``row``'s weights (swapped in first unless the network holds them)."""
        import time

        from evald.pipeline.suites.runner import NonFiniteScores

        assert self.evaluator is not None and name in self.suites, "ensure_built() first"
        load_s, provenance = 0.0, {}
        try:
            if self.loaded_step != row.step:
                self.loaded_step = None
                started = time.time()
                provenance = self.evaluator.load_only(ckpt_dir / row.source, row.kind, row.step)
                self.loaded_step, load_s = row.step, time.time() - started
            result = self.suites[name].run()
        except EvaluationInterrupted:
            raise
        except CheckpointDeleted as exc:
            return Failed(str(exc), DELETED)
        except (CheckpointError, NonFiniteScores) as exc:   # the weights' fault: evaluating again gives the same
            return Failed(str(exc))
        except Exception as exc:
            log.exception("suite %s on step %d (%s) raised unexpectedly", name, row.step, row.source)
            return Retry(f"suite {name} raised {exc!r}")
        return SuiteEvaluated(result, load_s, provenance)

    def _build(self, config: EvaldConfig, specs: EvaluationSpec) -> None:
        from evald.pipeline.device import select_device
        from evald.pipeline.metrics.plugins import load_metric, plugin_name

        task, model, data = specs.task, specs.model, specs.data
        if not self._device_selected:
            select_device(config.device.target, config.device.ids[0])
            self._device_selected = True
        log.info("building the evaluation network: task %s, model %s %s, data %s %s", task, model.target,
                 dict(model.kwargs), data.target, dict(data.kwargs))
        plugins = [_Plugin(plugin_name(spec), load_metric(spec)) for spec in config.metric_plugins]
        generation = None
        if task == "lm" and config.generation.prompts > 0:
            from evald.pipeline.tasks.generation import SampleGenerator

            g = config.generation
            generation = SampleGenerator(prompts=g.prompts, prompt_len=g.prompt_len, new_tokens=g.new_tokens,
                                         top_k=g.top_k, top_p=g.top_p, seed=g.seed)
        self.evaluator = None
        if self.group is not None:
            from evald.pipeline.group.evaluator import GroupEvaluator

            self.evaluator = GroupEvaluator(self.group, task=task, model=model, data=data,
                                            subset_size=config.subset_size, subset_seed=config.subset_seed,
                                            batch_size=config.batch_size, generation=config.generation,
                                            verify_swap=config.tuning.verify_swap,
                                            config_identity=specs.identity(),
                                            tensor_parallel=config.tensor_parallel)
            return
        self.evaluator = Evaluator(task=task, model=model, data=data, subset_size=config.subset_size,
                                   subset_seed=config.subset_seed, batch_size=config.batch_size,
                                   plugins=plugins, generation=generation, verify_swap=config.tuning.verify_swap,
                                   config_identity=specs.identity(), keep_alive=self.keep_alive)

    def evaluate(self, ckpt_dir: Path, row: Step) -> Outcome:
        assert self.evaluator is not None, "ensure_built() first"
        self.loaded_step = None
        self._named = (ckpt_dir / row.source, row.step)
        try:
            result = self.evaluator.evaluate(ckpt_dir / row.source, row.kind, should_abort=self.should_abort)
        except EvaluationInterrupted:
            raise
        except ReadInterrupted as exc:  # a signal stopped the read between chunks: not the checkpoint's fault
            raise EvaluationInterrupted(str(exc)) from exc
        except CheckpointDeleted as exc:
            return Failed(str(exc), DELETED)
        except CheckpointError as exc:
            return Failed(str(exc), identity=self.validation_identity)
        except Exception as exc:  # not the checkpoint's fault, as far as anyone can tell
            log.exception("evaluating step %d (%s) raised unexpectedly", row.step, row.source)
            return Retry(f"evaluation raised {exc!r}")
        self.loaded_step = row.step
        return Evaluated(result, self.validation_identity)
