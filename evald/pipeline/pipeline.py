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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

from evald.contracts.safetensors_io import ReadInterrupted
from evald.files.recognise import CheckpointDeleted, CheckpointError
from evald.config import EvaldConfig, factory_spec
from evald.pipeline.network import EvalResult, Evaluator
from evald.pipeline.factories import check_allowed
from evald.ledger.ledger import DELETED, FAILED, Step
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
        self._built_specs: tuple | None = None
        self._failed_specs: tuple | None = None
        self._device_selected = group is not None  # a group's ranks picked their devices before init()

    def ensure_built(self, config: EvaldConfig) -> bool:
        """Build the evaluator for ``config``'s factories if needed; False while it cannot be built."""
        model, data = factory_spec(config, "model"), factory_spec(config, "data")
        if model is None or data is None:
            self.blocked_reason = ("no model or data factory is known: pass --model-factory and --data-factory, "
                                   "or let the trainer announce them (EvaldHook(model_factory=..., "
                                   "data_factory=...))")
            return False
        specs = (config.task or "lm", model, data, config.subset_size, config.subset_seed, config.batch_size,
                 config.generation, config.metric_plugins)
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

    def _build(self, config: EvaldConfig, specs: tuple) -> None:
        from evald.pipeline.device import select_device
        from evald.pipeline.metrics.plugins import load_metric, plugin_name
        from evald.pipeline.provenance import config_identity

        task, model, data = specs[:3]
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
                                            config_identity=config_identity(*specs))
            return
        self.evaluator = Evaluator(task=task, model=model, data=data, subset_size=config.subset_size,
                                   subset_seed=config.subset_seed, batch_size=config.batch_size,
                                   plugins=plugins, generation=generation, verify_swap=config.tuning.verify_swap,
                                   config_identity=config_identity(*specs))

    def evaluate(self, ckpt_dir: Path, row: Step) -> Outcome:
        assert self.evaluator is not None, "ensure_built() first"
        try:
            result = self.evaluator.evaluate(ckpt_dir / row.source, row.kind, should_abort=self.should_abort)
        except EvaluationInterrupted:
            raise
        except ReadInterrupted as exc:  # a signal stopped the read between chunks: not the checkpoint's fault
            raise EvaluationInterrupted(str(exc)) from exc
        except CheckpointDeleted as exc:
            return Failed(str(exc), DELETED)
        except CheckpointError as exc:
            return Failed(str(exc))
        except Exception as exc:  # not the checkpoint's fault, as far as anyone can tell
            log.exception("evaluating step %d (%s) raised unexpectedly", row.step, row.source)
            return Retry(f"evaluation raised {exc!r}")
        return Evaluated(result)
