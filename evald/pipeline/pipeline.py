"""Load, verify and evaluate one checkpoint with the network compiled once.

The Pipeline owns the Evaluator: it builds it (and compiles the graph) as soon as the
model and data factories are known, from the configuration or the trainer's
announcement, not when the first checkpoint arrives. ``evaluate`` turns one step into
one of three outcomes (evald.pipeline.seam):

* ``Evaluated``: the metrics;
* ``Failed``: the checkpoint is bad (corrupt, wrong shapes, deleted); the reason is
  recorded and the step is never retried by itself;
* ``Retry``: something unexpected raised (a bug, an OOM); the step goes back to the
  queue with its attempt counted, and evald says so loudly, because such an error
  says nothing about the checkpoint.
EvaluationInterrupted (a forced shutdown, or a signal during a read) propagates: the caller re-queues
the step, or fails it after tuning.max_attempts interruptions. The benchmark suites on the same network
are its SuiteHost's (evald.pipeline.suite_host); the Pipeline swaps a step's weights in for them.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from evald.config import EvaldConfig, factory_spec
from evald.contracts.safetensors_io import ReadInterrupted
from evald.files.recognise import CheckpointDeleted, CheckpointError
from evald.ledger.ledger import DELETED, Step
from evald.pipeline.factories import check_allowed
from evald.pipeline.group.protocol import Group
from evald.pipeline.network import Evaluator, Held
from evald.pipeline.seam import (EvaluationPipeline, Evaluated, Failed, Outcome, Retry,  # noqa: F401 (re-exported)
                                 ServablePipeline, SuiteEvaluated, SuiteOutcome)
from evald.pipeline.suite_host import SuiteHost
from evald.pipeline.swap.provenance import EvaluationSpec
from evald.pipeline.subset import SubsetInfo
from evald.pipeline.tasks.base import EvaluationInterrupted, ShouldAbort

if TYPE_CHECKING:   # the suites' runner imports lm-eval: only when a suite is configured, not for a type
    from evald.pipeline.group.evaluator import GroupEvaluator
    from evald.pipeline.suites.runner import SuiteRunner

log = logging.getLogger("evald.pipeline.pipeline")


class Pipeline:
    def __init__(self, should_abort: ShouldAbort, group: Group | None = None, device_selected: bool = False,
                 keep_alive: Callable[[], None] = lambda: None) -> None:
        """``device_selected``: this process has chosen its device already (an eval group's ranks do before
        init(); so does a process whose MindSpore runtime already runs kernels, where choosing fails).
        ``keep_alive`` is called between the steps of building the network (graphs compile for seconds each):
        the server's republishes its control state, so that a trainer that connects meanwhile hears evald."""
        self.should_abort, self.keep_alive = should_abort, keep_alive
        self.group = group  # an eval group's rank 0 (evald.pipeline.group.protocol.Group): every rank builds and evaluates
        self.evaluator: Evaluator | GroupEvaluator | None = None  # a group's rank 0 holds a GroupEvaluator
        self.blocked_reason: str | None = None   # why nothing can be evaluated now, when so
        self._built_specs: EvaluationSpec | None = None
        self._failed_specs: EvaluationSpec | None = None
        self._device_selected = device_selected or group is not None
        self._suites = SuiteHost(group)           # every suite's life: planned, built, refused, evaluated
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
        self._suites.plan(config, specs)
        return True

    @property
    def validation_identity(self) -> str | None:
        """sha256 of the validation's effective config (model, data, subset, settings), once built."""
        from evald.pipeline.swap.provenance import sha256_of

        if self.evaluator is None or self._built_specs is None:
            return None
        return sha256_of(self._built_specs.identity())

    # -- the benchmark suites (evald.pipeline.suite_host) ----------------------------------------------
    @property
    def suites(self) -> Mapping[str, SuiteRunner]:
        return self._suites.suites

    @property
    def suite_errors(self) -> Mapping[str, str]:
        return self._suites.suite_errors

    @property
    def suites_pending(self) -> tuple[str, ...]:
        return self._suites.pending

    @property
    def _building(self) -> SuiteRunner | None:   # the suite whose graphs compile now (a test watches it)
        return self._suites.building

    def build_next_suite(self) -> bool:
        """One piece of building the next pending suite (SuiteHost.build_next), False when none is pending."""
        return self._suites.build_next(self.evaluator.network if self.evaluator is not None else None)

    def refuse_suite(self, name: str, reason: str) -> None:
        self._suites.refuse(name, reason)

    def evaluate_suite(self, name: str, ckpt_dir: Path, row: Step) -> SuiteOutcome:
        """Suite ``name`` on step ``row``'s weights (swapped in first unless the network holds them)."""
        assert self.evaluator is not None, "ensure_built() first"
        return self._suites.evaluate(name, row, lambda: self._load(ckpt_dir, row))

    def _load(self, ckpt_dir: Path, row: Step) -> tuple[float, dict]:
        """Swap step ``row``'s weights in unless the network holds them: (seconds it took, their provenance)."""
        if self.loaded_step == row.step:
            return 0.0, {}
        assert self.evaluator is not None
        self.loaded_step, started = None, time.time()
        provenance = self.evaluator.load_only(ckpt_dir / row.source, row.kind, row.step)
        self.loaded_step = row.step
        return time.time() - started, provenance

    def _build(self, config: EvaldConfig, specs: EvaluationSpec) -> None:
        from evald.pipeline.device import select_device
        from evald.pipeline.metrics.plugins import load_plugins

        task, model, data = specs.task, specs.model, specs.data
        if not self._device_selected:
            select_device(config.device.target, config.device.ids[0])
            self._device_selected = True
        log.info("building the evaluation network: task %s, model %s %s, data %s %s", task, model.target,
                 dict(model.kwargs), data.target, dict(data.kwargs))
        plugins = load_plugins(config.metric_plugins)
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
