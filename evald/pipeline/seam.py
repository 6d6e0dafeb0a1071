"""The typed seam between the daemon and the pipeline: what the daemon may ask of a pipeline (protocols) and
what each evaluation turns into (outcomes). As vLLM's ``EngineClient`` is the one interface between its API
server and its engine, these are the one interface between evald's loop and its network: the daemon calls
them, never reaches into the pipeline's state, and tests give stand-ins that satisfy them.

* ``Evaluated``: the metrics; ``Failed``: the checkpoint is bad (corrupt, wrong shapes, deleted), the reason
  recorded and the step never retried by itself; ``Retry``: something unexpected raised (a bug, an OOM), the
  step goes back to the queue with its attempt counted. A suite cell's outcome is ``SuiteEvaluated``,
  ``Failed`` or ``Retry``.
* ``SuiteHosting``: a suite's life as the daemon sees it (built, refused with a reason, evaluated), read-only
  views and calls; ``EvaluationPipeline``: the validation and the suites; ``ServablePipeline``: what the HTTP
  endpoint uses.

May import: config, ledger; within evald.pipeline: network, subset (types only).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Protocol, Union

from evald.config import EvaldConfig
from evald.ledger.ledger import FAILED, Step
from evald.pipeline.network import EvalResult, Held
from evald.pipeline.subset import SubsetInfo

if TYPE_CHECKING:   # the suites' runner imports lm-eval: only when a suite is configured, not for a type
    from evald.pipeline.suites.runner import SuiteResult, SuiteRunner


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


@dataclass(frozen=True)
class SuiteEvaluated:
    result: SuiteResult
    load_s: float                # 0 when the network already held the step's weights
    provenance: dict


SuiteOutcome = Union[SuiteEvaluated, Failed, Retry]


class SuiteHosting(Protocol):
    """A suite's life as the daemon sees it (evald.pipeline.suite_host.SuiteHost owns it): read-only views and
    the calls that change it; the daemon never assigns to a pipeline's attribute nor writes into its views."""

    @property
    def suites(self) -> Mapping[str, SuiteRunner]:
        """Name -> its runner, once built."""

    @property
    def suite_errors(self) -> Mapping[str, str]:
        """Name -> why it cannot run."""

    @property
    def suites_pending(self) -> tuple[str, ...]:
        """Configured suites not built yet (build_next_suite builds them)."""

    def build_next_suite(self) -> bool:
        """One piece of building a pending suite (or fail it, with its reason in suite_errors); False when none
        is pending."""

    def refuse_suite(self, name: str, reason: str) -> None:
        """Suite ``name`` does not run in this process: out of ``suites`` (and pending), ``reason`` in
        ``suite_errors`` (its queued cells say why)."""

    def evaluate_suite(self, name: str, ckpt_dir: Path, row: Step) -> SuiteOutcome: ...


class EvaluationPipeline(SuiteHosting, Protocol):
    """What the daemon needs of a pipeline: the real one (evald.pipeline.pipeline), or a test's stand-in."""

    blocked_reason: str | None

    @property
    def subset(self) -> SubsetInfo | None:
        """The fixed subset of the network built, or None before one is."""

    @property
    def validation_identity(self) -> str | None:
        """The default validation's identity (sha256 of its settings), once built."""

    def ensure_built(self, config: EvaldConfig) -> bool: ...

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
