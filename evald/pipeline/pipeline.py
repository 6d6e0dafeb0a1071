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
EvaluationInterrupted (a forced shutdown) propagates: the caller re-queues the step.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol, Union

from evald.config import EvaldConfig, factory_spec
from evald.files.recognise import CheckpointDeleted, CheckpointError
from evald.ledger.ledger import DELETED, FAILED, Step
from evald.pipeline.factories import check_allowed
from evald.pipeline.network import EvalResult, Evaluator, Held
from evald.pipeline.provenance import EvaluationSpec
from evald.pipeline.subset import SubsetInfo
from evald.pipeline.tasks.base import EvaluationInterrupted, ShouldAbort

log = logging.getLogger("evald.pipeline.pipeline")


@dataclass(frozen=True)
class Evaluated:
    result: EvalResult


@dataclass(frozen=True)
class Failed:
    reason: str
    state: str = FAILED


@dataclass(frozen=True)
class Retry:
    reason: str


Outcome = Union[Evaluated, Failed, Retry]


class EvaluationPipeline(Protocol):
    """What the daemon needs of a pipeline: the real one below, or a test's stand-in."""

    blocked_reason: str | None

    @property
    def subset(self) -> SubsetInfo | None:
        """The fixed subset of the network built, or None before one is."""

    def ensure_built(self, config: EvaldConfig) -> bool: ...

    def evaluate(self, ckpt_dir: Path, row: Step) -> Outcome: ...


@dataclass(frozen=True)
class _Plugin:
    name: str
    metric: Any


class Pipeline:
    def __init__(self, should_abort: ShouldAbort, group: Any = None) -> None:
        self.should_abort = should_abort
        self.group = group  # an eval group's rank 0 (evald.pipeline.group_protocol.Group): every rank builds and evaluates
        self.evaluator: Evaluator | None = None
        self.blocked_reason: str | None = None   # why nothing can be evaluated now, when so
        self._built_specs: EvaluationSpec | None = None
        self._failed_specs: EvaluationSpec | None = None
        self._device_selected = group is not None  # a group's ranks picked their devices before init()
        self._named: tuple[Path, int] | None = None   # the path last swapped in, and its ledger step

    # -- what the HTTP endpoint serves from (evald.serve; the daemon calls these between jobs) ---------
    @property
    def network(self) -> Any:
        """This process's compiled network (rank 0's in an eval group), or None before one is built."""
        local = getattr(self.evaluator, "local", self.evaluator)
        return local.network if local is not None else None

    def held(self) -> Held | None:
        """The checkpoint the network holds now, its swap proven, with its ledger step; None mid-swap."""
        local = getattr(self.evaluator, "local", self.evaluator)
        held = local.held if local is not None else None
        if held is not None and self._named is not None and self._named[0] == held.path:
            return replace(held, step=self._named[1])
        return held

    def swap_in(self, ckpt_dir: Path, row: Step) -> Held:
        """Swap ``row``'s checkpoint into this process's network, proven, without evaluating it (a pinned
        request, between evaluations; the next evaluation swaps its own checkpoint in as always)."""
        local = getattr(self.evaluator, "local", self.evaluator)
        if local is None:
            raise RuntimeError("no evaluation network is built yet")
        self._named = (ckpt_dir / row.source, row.step)
        local.swap_in(ckpt_dir / row.source, row.kind, row.step)
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
        return True

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
            from evald.pipeline.group_evaluator import GroupEvaluator

            self.evaluator = GroupEvaluator(self.group, task=task, model=model, data=data,
                                            subset_size=config.subset_size, subset_seed=config.subset_seed,
                                            batch_size=config.batch_size, generation=config.generation,
                                            verify_swap=config.tuning.verify_swap,
                                            config_identity=specs.identity())
            return
        self.evaluator = Evaluator(task=task, model=model, data=data, subset_size=config.subset_size,
                                   subset_seed=config.subset_seed, batch_size=config.batch_size,
                                   plugins=plugins, generation=generation, verify_swap=config.tuning.verify_swap,
                                   config_identity=specs.identity())

    def evaluate(self, ckpt_dir: Path, row: Step) -> Outcome:
        assert self.evaluator is not None, "ensure_built() first"
        self._named = (ckpt_dir / row.source, row.step)
        try:
            result = self.evaluator.evaluate(ckpt_dir / row.source, row.kind, should_abort=self.should_abort)
        except EvaluationInterrupted:
            raise
        except CheckpointDeleted as exc:
            return Failed(str(exc), DELETED)
        except CheckpointError as exc:
            return Failed(str(exc))
        except Exception as exc:  # not the checkpoint's fault, as far as anyone can tell
            log.exception("evaluating step %d (%s) raised unexpectedly", row.step, row.source)
            return Retry(f"evaluation raised {exc!r}")
        return Evaluated(result)
