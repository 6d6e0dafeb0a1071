"""Putting failures back in the queue: ``evald retry``, and a configuration that changed.

A failure is final for the configuration that judged it, not for ever:

* ``evald retry [STEP ...]`` re-queues failed (and deleted) steps, all of them when
  none is named, and the named steps the lag policy skipped; ``--step N`` evaluates an
  evaluated step again (its result kept, superseded). A step the run does not have is an
  error naming those it has. It forgets rejected files so that they are judged again. It is one
  ledger transaction, safe while evald runs: a running evald evaluates queued steps
  from the ledger at every turn of its loop, and sees the retry counter (``kv``
  ``retries``) change, forgets which names it judged and rescans the directory.
* When the effective configuration that may explain failures changed since they were
  judged, evald re-queues them at start and says so: another model or data factory
  (or their kwargs, or the task) re-queues the steps that failed while being evaluated;
  another ``--foreign-steps-per-epoch`` forgets the files rejected for want of a step.

A step re-queued either way is marked ``found_via = retry``; the lag policy never skips
it, as it never skips a run's final step (you asked for it).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any, Sequence

from evald.config import EvaldConfig, factory_spec
from evald.ledger.ledger import DELETED, EVALUATING, FAILED, QUEUED, REJECTED, SKIPPED, Ledger

log = logging.getLogger("evald")

RETRY = "retry"  # found_via of a re-queued step
JUDGED_WITH = "judged_with"
RETRIES = "retries"


@dataclass(frozen=True)
class Retried:
    requeued: tuple[int, ...]     # steps back in the queue
    rejudged: tuple[str, ...]     # files to be judged again (their failed step, if any, forgotten)
    not_failed: tuple[int, ...]   # evaluated steps named without --step (left alone)
    waiting: tuple[int, ...] = ()  # steps named that are queued or being evaluated already (left alone)

    def describe(self) -> str:
        parts = [f"re-queued {len(self.requeued)} step(s){': ' + _list(self.requeued) if self.requeued else ''}",
                 f"{len(self.rejudged)} rejected file(s) to be judged again"
                 f"{': ' + ', '.join(self.rejudged) if self.rejudged else ''}"]
        if self.not_failed:
            parts.append(f"not failed, left alone: {_list(self.not_failed)} (evaluated: `evald retry --step N` "
                         f"evaluates a step again)")
        if self.waiting:
            parts.append(f"queued already: {_list(self.waiting)}")
        return "; ".join(parts)


class UnknownSteps(ValueError):
    """Steps asked for that the run does not have (nothing was changed)."""

    def __init__(self, unknown: Sequence[int], known: Sequence[int]) -> None:
        super().__init__(f"no such step in this run: {_list(unknown)}; its steps are "
                         f"{shown_steps(known) if known else 'none yet'}")
        self.unknown, self.known = tuple(unknown), tuple(known)


def retry(ledger: Ledger, steps: Sequence[int] | None, reason: str, evaluated_too: bool = False) -> Retried:
    """Re-queue failed steps (all of them when ``steps`` is None) in one transaction; named steps that
    the lag policy skipped are queued too (you asked for them); with ``evaluated_too``, the named steps
    that were evaluated are evaluated again, their results kept as superseded (``evald retry --step N``).
    Raises UnknownSteps, changing nothing, when a named step is not in the run."""
    if steps:
        known = ledger.step_numbers()
        unknown = sorted(set(steps) - set(known))
        if unknown:
            raise UnknownSteps(unknown, known)
    again: list[int] = []
    if evaluated_too and steps:
        again = ledger.supersede_steps(sorted(set(steps)), RETRY, reason)
    failed = {row.step: row for row in ledger.steps(FAILED, DELETED)}
    skipped = {row.step for row in ledger.steps(SKIPPED)}
    waiting = {row.step for row in ledger.steps(QUEUED, EVALUATING)} - set(again)
    rejected = {name: step for name, step, status, _ in ledger.files() if status == REJECTED}
    wanted = sorted(failed) if steps is None else sorted(set(steps))
    requeue = [s for s in wanted if (s in failed and failed[s].source not in rejected) or s in skipped]
    forget_steps = [s for s in wanted if s in failed and failed[s].source in rejected]
    forget_files = [name for name, step in rejected.items() if step in forget_steps]  # a step's parts, too
    if steps is None:
        forget_files += [name for name, step in rejected.items() if step is None]
    ledger.requeue_failures(requeue, forget_steps, forget_files, reason, counter=RETRIES)
    return Retried(tuple(sorted(again + requeue)), tuple(sorted(forget_files)),
                   tuple(s for s in wanted if s not in failed and s not in skipped and s not in waiting
                         and s not in again),
                   tuple(s for s in wanted if s in waiting))


def shown_steps(steps: Sequence[int], most: int = 20) -> str:
    """Steps for a message: all of them when few, else the first and last ones and how many."""
    steps = sorted(steps)
    if len(steps) <= most:
        return _list(steps)
    half = most // 2
    return f"{_list(steps[:half])}, ..., {_list(steps[-half:])} ({len(steps)} in all)"


class RetryWatch:
    """Notices an ``evald retry`` made while this evald runs (the ledger's retry counter changed)."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.seen = ledger.get_state(RETRIES, 0)

    def changed(self) -> bool:
        now = self.ledger.get_state(RETRIES, 0)
        if now == self.seen:
            return False
        self.seen = now
        log.info("evald retry re-queued failures: %d step(s) queued, rejected files judged again",
                 len(self.ledger.steps(QUEUED)))
        return True


def fingerprint(config: EvaldConfig) -> dict[str, Any]:
    """What a failure's verdict may depend on: the network and data, and the foreign step rule."""
    model, data = factory_spec(config, "model"), factory_spec(config, "data")
    network = None
    if model is not None and data is not None:
        network = [config.task or "lm", model.target, dict(model.kwargs), data.target, dict(data.kwargs)]
    return {"network": network, "foreign_steps_per_epoch": config.foreign_steps_per_epoch}


def requeue_if_config_changed(ledger: Ledger, config: EvaldConfig, *, network_known: bool) -> Retried | None:
    """Re-queue the failures a configuration change may explain; remember what judges from now on.

    ``network_known``: the network is built, so failures from now on are judged with it.
    """
    before = ledger.get_state(JUDGED_WITH) or {}
    now = fingerprint(config)
    after = dict(before)
    forget: list[str] = []
    requeue: list[int] = []
    why = []
    if before.get("foreign_steps_per_epoch", now["foreign_steps_per_epoch"]) != now["foreign_steps_per_epoch"]:
        forget = [name for name, step, status, _ in ledger.files() if status == REJECTED and step is None]
        why.append(f"--foreign-steps-per-epoch changed from {before['foreign_steps_per_epoch']} to "
                   f"{now['foreign_steps_per_epoch']}")
    after["foreign_steps_per_epoch"] = now["foreign_steps_per_epoch"]
    if network_known and now["network"] is not None:
        if before.get("network") is not None and not _same(before["network"], now["network"]):
            rejected = {name for name, _, status, _ in ledger.files() if status == REJECTED}
            requeue = [row.step for row in ledger.steps(FAILED) if row.source not in rejected]
            why.append(f"the network or data changed from {_show(before['network'])} to {_show(now['network'])}")
        after["network"] = now["network"]
    if after == before:
        return None
    reason = "re-queued at start: " + "; ".join(why) if why else ""
    ledger.requeue_failures(requeue, [], forget, reason, counter=None, kv={JUDGED_WITH: after})
    if requeue or forget:
        done = Retried(tuple(requeue), tuple(forget), ())
        log.warning("%s, so the failures it may explain are tried again: %s", "; ".join(why), done.describe())
        return done
    return None


def _same(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def _show(network: list) -> str:
    task, model, model_kwargs, data, data_kwargs = network
    return f"{task} {model} {json.dumps(model_kwargs, sort_keys=True)} / {data} {json.dumps(data_kwargs, sort_keys=True)}"


def _list(steps: Sequence[int]) -> str:
    return ", ".join(str(s) for s in steps)
