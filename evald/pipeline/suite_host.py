"""A suite's life, owned in one place: planned for a configuration, built one piece a loop turn, refused with
a reason, evaluated on the weights the network holds.

``SuiteHost.plan`` takes the configured suites (once per configuration: another one replans them all).
``build_next`` then builds them one piece a call, so that a checkpoint that arrives meanwhile waits for one
piece, never a whole build (tens of seconds): the tokenizer (once), a suite's lm-eval tasks with the
vocabulary check, then its graphs one a call (seconds each at LLM shapes). A suite is in ``suites`` once its
last graph is compiled; one whose build fails is in ``suite_errors`` with the reason, and the others go on;
``refuse`` takes a suite out with a reason (the daemon's, when the run's tokenizer changed). ``suites`` and
``suite_errors`` are read-only views: only the host changes them.
``evaluate`` runs a built suite after ``load`` (the caller's swap of the step's weights, when the network does
not hold them already) and says what became of it: ``SuiteEvaluated``, ``Failed`` (the weights' fault:
evaluating again gives the same) or ``Retry`` (anything unexpected).

On an eval group (``group``), a suite's requests are split over the ranks its ``device`` names
(evald.pipeline.group.scoring.GroupScorer); lm-eval sees one rank.

May import: config, contracts, files, ledger; within evald.pipeline: engine, factories, group, suites, tasks.
"""

from __future__ import annotations

import logging
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Callable, Mapping

from evald.config import EvaldConfig
from evald.files.recognise import CheckpointDeleted, CheckpointError
from evald.ledger.ledger import DELETED, Step
from evald.pipeline.factories import check_allowed
from evald.pipeline.group.protocol import Group
from evald.pipeline.seam import Failed, Retry, SuiteEvaluated, SuiteOutcome
from evald.pipeline.swap.provenance import EvaluationSpec
from evald.pipeline.tasks.base import EvaluationInterrupted

if TYPE_CHECKING:   # the suites' runner imports lm-eval: only when a suite is configured, not for a type
    from evald.pipeline.suites.runner import SuiteRunner

log = logging.getLogger("evald.pipeline.pipeline")

# Swap a step's weights in unless the network holds them: (seconds it took, their provenance)
Load = Callable[[], tuple[float, dict]]


class SuiteHost:
    def __init__(self, group: Group | None = None) -> None:
        self.group = group
        self._suites: dict[str, SuiteRunner] = {}
        self._errors: dict[str, str] = {}          # name -> why the suite cannot run
        self.pending: tuple[str, ...] = ()         # configured, not built yet: built between evaluations
        self._planned_for: Any = None              # what the suites were planned for
        self._plan: tuple[EvaldConfig, EvaluationSpec] | None = None   # what the pending ones are for
        self._tokenizer: Any = None                # the suites' tokenizer, built with the first of them
        self._model_vocab: int | None = None       # the network's vocabulary (its logits), measured once
        self.building: SuiteRunner | None = None   # the first pending suite, its graphs being compiled

    @property
    def suites(self) -> Mapping[str, SuiteRunner]:
        """Name -> its runner, once its last graph is compiled (a read-only view)."""
        return MappingProxyType(self._suites)

    @property
    def suite_errors(self) -> Mapping[str, str]:
        """Name -> why the suite cannot run (a read-only view)."""
        return MappingProxyType(self._errors)

    def refuse(self, name: str, reason: str) -> None:
        """Suite ``name`` does not run here (the daemon found its tokenizer changed within the run): dropped
        from the built and the pending ones, ``reason`` in ``suite_errors``."""
        self._suites.pop(name, None)
        if self.building is not None and self.building.name == name:
            self.building = None
        self.pending = tuple(p for p in self.pending if p != name)
        self._errors[name] = reason

    def plan(self, config: EvaldConfig, specs: EvaluationSpec) -> None:
        """Plan ``config``'s benchmark suites on the network of ``specs`` (once per configuration); they are
        built later, one piece per ``build_next``."""
        wanted = (dict(config.suites or {}), config.tokenizer_factory, config.tokenizer_kwargs, specs)
        if wanted == self._planned_for:
            return
        self._planned_for, self._suites, self._errors = wanted, {}, {}
        self._plan, self._tokenizer, self._model_vocab = (config, specs), None, None
        self.pending, self.building = tuple(sorted(config.suites or {})), None

    def build_next(self, network: Any) -> bool:
        """One piece of building the next pending suite on ``network`` (the module's docstring); False when
        none is pending."""
        if not self.pending or self._plan is None or network is None:
            return False
        config, specs = self._plan
        if self._tokenizer is None and not self._build_tokenizer(config):
            return True
        name = self.pending[0]
        try:
            if self.building is None or self.building.name != name:
                self.building = self._new_suite(name, config, specs, network)
                return True
            if not self.building.warm_next():
                return True
            self._suites[name] = self.building
        except Exception as exc:  # noqa: BLE001 - one broken suite must not stop the others
            self._errors[name] = f"cannot build suite {name}: {exc}"
            log.error("%s; its queued cells wait until it is fixed", self._errors[name],
                      exc_info=not isinstance(exc, (ValueError, KeyError, ImportError)))
        self.building, self.pending = None, self.pending[1:]
        return True

    def _new_suite(self, name: str, config: EvaldConfig, specs: EvaluationSpec, network: Any) -> SuiteRunner:
        """Suite ``name``'s runner (its tasks loaded, no graph compiled yet), the tokenizer checked against the
        model's vocabulary."""
        from evald.pipeline.suites.runner import SuiteRunner
        from evald.pipeline.suites.tokenizer import check_covers

        options = config.suites[name]
        log.info("building suite %s: its tasks now, then its graphs one at a time between evaluations", name)
        network_identity = {"model": specs.model.target, "model_kwargs": dict(specs.model.kwargs), "task": specs.task}
        scorer = None
        if self.group is not None:  # the requests split over the group's ranks; lm-eval sees one
            from evald.pipeline.engine import TokenScorer
            from evald.pipeline.group.scoring import GroupScorer

            ids = config.device.ids
            wanted = {int(i) for i in options.device.split(",")} if options.device else set(ids)
            ranks = [r for r in range(self.group.size) if ids[r % len(ids)] in wanted]
            scorer = GroupScorer(self.group, TokenScorer(network, max_length=options.max_length,
                                                         batch_size=options.batch_size), ranks,
                                 tensor_parallel=config.tensor_parallel > 1)
        runner = SuiteRunner(name, options, network, self._tokenizer, network_identity=network_identity, scorer=scorer)
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
            for name in self.pending:
                self._errors[name] = f"cannot build the tokenizer: {exc}"
            self.pending = ()
            log.error("benchmark suites not run: cannot build the tokenizer: %s", exc)
            return False
        return True

    def evaluate(self, name: str, row: Step, load: Load) -> SuiteOutcome:
        """Suite ``name`` on step ``row``'s weights, swapped in by ``load`` first (the module's docstring)."""
        from evald.pipeline.suites.runner import NonFiniteScores

        runner = self._suites.get(name)
        assert runner is not None, f"suite {name} is not built"
        try:
            load_s, provenance = load()
            result = runner.run()
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
