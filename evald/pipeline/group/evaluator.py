"""Evaluation on every rank of an eval group (docs/eval-group.md).

Rank 0's Pipeline holds a ``GroupEvaluator`` where a one-device evald holds an Evaluator:
building it and evaluating a checkpoint are commands to the whole group. Every rank (rank 0
too) keeps a local Evaluator for its ``part``: every ``size``-th batch of the fixed subset and
a slice of the generation prompts. The answer is one collective that carries each rank's
status and its rows of full-size arrays; rank 0 computes the metrics from exactly the
per-sample values a single device would have produced (``Evaluator.metrics_of``).

The other ranks run ``follow``: they wait for rank 0's commands and answer them, and
never touch the ledger, TensorBoard or the sockets.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from evald.contracts.wire import FactorySpec
from evald.files.errors import CheckpointDeleted, CheckpointError, CheckpointFileBad
from evald.pipeline.group.protocol import (BAD_FILE, BUILD, DELETED, ERROR, EVALUATE, EXIT, FAILED, GENERATE, OK,
                                          OP_NAMES, SCORE, SWAP, WARM, Group)
from evald.pipeline.group.scoring import generate_share, score_share, warm_share
from evald.pipeline.network import EvalResult, Evaluator, PartResult
from evald.pipeline.tasks.base import EvaluationInterrupted, ShouldAbort, never

log = logging.getLogger("evald.group")


def build_spec(*, task: str, model: FactorySpec, data: FactorySpec, subset_size: int, subset_seed: int,
               batch_size: int, generation: Any, verify_swap: str = "sampled",
               config_identity: Mapping[str, Any] | None = None, tensor_parallel: int = 1) -> dict:
    """What every rank needs to build the same evaluation network (a JSON-able BUILD payload)."""
    def factory(spec: FactorySpec) -> dict:
        return {"target": spec.target, "kwargs": dict(spec.kwargs), "search_path": spec.search_path}
    return {"task": task, "model": factory(model), "data": factory(data), "subset_size": subset_size,
            "subset_seed": subset_seed, "batch_size": batch_size,
            "generation": dataclasses.asdict(generation) if generation is not None else None,
            "verify_swap": verify_swap, "config_identity": dict(config_identity or {}),
            "tensor_parallel": tensor_parallel}


def build_local(spec: Mapping[str, Any], part: tuple[int, int]) -> Evaluator:
    """This rank's Evaluator for ``part`` (rank, size) of the work described by ``spec``. In a
    tensor-parallel group every rank evaluates all of the work on its shard of the model: its part is
    the whole, and its (degree, rank) go to the model factory and the weights' reader."""
    degree = int(spec.get("tensor_parallel", 1))
    tensor_parallel = (degree, part[0]) if degree > 1 else (1, 0)
    if degree > 1:
        part = (0, 1)
    generation = None
    options = spec.get("generation")
    if spec["task"] == "lm" and options and options["prompts"] > 0:
        from evald.pipeline.tasks.generation import SampleGenerator

        generation = SampleGenerator(**options)
    return Evaluator(task=spec["task"], model=FactorySpec(**spec["model"]), data=FactorySpec(**spec["data"]),
                     subset_size=spec["subset_size"], subset_seed=spec["subset_seed"],
                     batch_size=spec["batch_size"], generation=generation, part=part,
                     verify_swap=spec["verify_swap"], config_identity=spec["config_identity"],
                     tensor_parallel=tensor_parallel)


def status_of(exc: Exception) -> int:
    """The code a rank answers for what it raised (evald.pipeline.group.protocol)."""
    if isinstance(exc, CheckpointDeleted):
        return DELETED
    if isinstance(exc, CheckpointFileBad):
        return BAD_FILE
    return FAILED if isinstance(exc, CheckpointError) else ERROR


def verdict(statuses: list[tuple[int, str]], own: Exception | None, what: str) -> None:
    """Raise what the group's answers say about the checkpoint, or return when every rank succeeded.

    A file found bad by any rank fails the checkpoint with that rank's reason, which is one device's reason
    for the same file (on a shared filesystem it is a fact about the file, and in a tensor-parallel group
    each file is verified by one rank only). Otherwise rank 0's own error, as on one device. A failure on
    another rank only says nothing certain about the checkpoint: an unexpected error, retried."""
    bad = [(rank, text) for rank, (code, text) in enumerate(statuses) if code == BAD_FILE]
    if bad:
        rank, text = bad[0]
        if isinstance(own, CheckpointFileBad) and rank == 0:
            raise own
        log.error("eval rank %d found a bad file in %s: %s", rank, what, text)
        raise CheckpointFileBad(text)
    if own is not None:
        raise own
    others = [f"rank {rank}: {text}" for rank, (code, text) in enumerate(statuses) if code != OK]
    if others:
        raise RuntimeError(f"the other eval ranks could not {what} ({'; '.join(others)})")


class _AnotherRankFailed(Exception):
    """This rank swapped the checkpoint in, another did not: nothing is evaluated (a tensor-parallel
    model's own collectives need every rank), and the agreement's answers are the evaluation's."""

    def __init__(self, statuses: list[tuple[int, str]]) -> None:
        super().__init__("another eval rank could not load the checkpoint")
        self.statuses = statuses


def evaluate_part(evaluator: Evaluator | None, group: Group, path: str, kind: str, should_abort: ShouldAbort
                  ) -> tuple[list[tuple[int, str]], dict, PartResult | None, Exception | None]:
    """Evaluate this rank's part and exchange answers: (statuses, whole arrays, own part, own error).

    In a tensor-parallel group the ranks first agree that every one of them swapped the checkpoint in
    (one answer, statuses only), because the model's forward runs collectives of its own that every rank
    must join: a rank whose load failed (a bad file only it verified) would otherwise wait in the answer
    while the others wait in the model. If any rank failed, that agreement is the evaluation's answer and
    no rank runs the model; otherwise the evaluation's answer follows as usual."""
    code, text, part, error = OK, "", None, None
    tensor_parallel = evaluator is not None and evaluator.tensor_parallel[0] > 1
    agreed = False

    def agree() -> None:
        nonlocal agreed
        agreed = True
        statuses, _ = group.answer(OK)
        if any(c != OK for c, _ in statuses):
            raise _AnotherRankFailed(statuses)
        group.awaiting_answer = True   # the evaluation's own answer is still owed

    try:
        if evaluator is None:
            raise RuntimeError("this rank has no evaluation network (its build failed)")
        part = evaluator.evaluate_part(Path(path), kind, should_abort,
                                       after_swap=agree if tensor_parallel else lambda: None)
        if tensor_parallel and group.rank != 0:  # every rank computed the same values:
            part = dataclasses.replace(part, arrays={k: np.zeros_like(v) for k, v in part.arrays.items()})
            # rank 0's alone go into the SUM
    except EvaluationInterrupted:
        raise  # a forced shutdown: no answer; msrun ends the other ranks
    except _AnotherRankFailed as exc:
        return exc.statuses, {}, None, None
    except Exception as exc:  # noqa: BLE001 - every rank must answer, whatever happened to it
        code = status_of(exc)
        text, error = str(exc) if code != ERROR else repr(exc), exc
        if code == ERROR:
            log.exception("rank %d: evaluating %s raised unexpectedly", group.rank, path)
        if tensor_parallel and not agreed:   # this rank's swap failed: the others wait to agree on it
            statuses, _ = group.answer(code, text)
            return statuses, {}, None, error
    layout = evaluator.layout if evaluator is not None else {}
    statuses, combined = group.answer(code, text, part.arrays if part is not None else None, layout)
    return statuses, combined, part, error


class GroupEvaluator:
    """Rank 0's stand-in for an Evaluator: the same ``subset`` and ``evaluate``, done by the whole group."""

    def __init__(self, group: Group, **spec_args: Any) -> None:  # spec_args: build_spec's
        self.group = group
        spec = build_spec(**spec_args)
        group.command(BUILD, spec)
        self.local: Evaluator | None = None
        code, text, error = OK, "", None
        try:
            self.local = build_local(spec, (group.rank, group.size))
        except Exception as exc:  # noqa: BLE001 - the other ranks wait for this rank's answer
            code, text, error = ERROR, f"{type(exc).__name__}: {exc}", exc
        statuses, _ = group.answer(code, text)
        if error is not None:
            raise error
        failed = [f"rank {rank}: {text}" for rank, (code, text) in enumerate(statuses) if code != OK]
        if failed:
            raise RuntimeError(f"the eval group could not build the network on every rank ({'; '.join(failed)})")
        self.subset = self.local.subset  # type: ignore[union-attr]
        if self.local.tensor_parallel[0] > 1:  # type: ignore[union-attr]
            log.info("tensor-parallel eval group of %d ranks ready: each holds 1/%d of every tensor-parallel "
                     "weight and evaluates all %d batches with the others", group.size, group.size,
                     len(self.local.batches))  # type: ignore[union-attr]
        else:
            log.info("eval group of %d ranks ready: rank 0 evaluates %d of %d batches", group.size,
                     len(self.local.part_batches), len(self.local.batches))  # type: ignore[union-attr]

    @property
    def network(self) -> Any:
        return self.local.network  # type: ignore[union-attr]

    def load_only(self, path: Path, kind: str, step: int | None = None) -> dict[str, Any]:
        """Every rank loads and proves ``path``; rank 0's provenance. CheckpointError as on one device."""
        self.group.command(SWAP, {"path": str(path), "kind": kind})
        statuses, error, provenance = swap_share(self.local, self.group, str(path), kind)
        verdict(statuses, error, f"load {path.name}")
        return provenance

    def evaluate(self, path: Path, kind: str, should_abort: ShouldAbort = never) -> EvalResult:
        """Every rank evaluates its part of ``path``; a bad checkpoint on rank 0, or a bad file on any rank,
        fails as on one device; any other failure only on another rank is unexpected (it says nothing
        certain about the file): retried (``verdict``)."""
        started = time.time()
        self.group.command(EVALUATE, {"path": str(path), "kind": kind})
        statuses, arrays, part, error = evaluate_part(self.local, self.group, str(path), kind, should_abort)
        verdict(statuses, error, f"evaluate {path.name}")
        metrics, texts = self.local.metrics_of(arrays)  # type: ignore[union-attr]
        if part is None:  # cannot happen: no error means rank 0 evaluated its part
            raise RuntimeError(f"rank 0 returned no part of {path.name} and no error")
        evaluate_s = time.time() - started - part.load_s - part.verify_s
        return EvalResult(metrics, texts, part.load_s, evaluate_s, part.verify_s, part.provenance)


def swap_share(evaluator: Evaluator | None, group: Group, path: str, kind: str
               ) -> tuple[list, Exception | None, dict]:
    """Every rank loads and proves ``path`` (a benchmark cell of a step other than the last validated)."""
    code, text, error, provenance = OK, "", None, {}
    try:
        if evaluator is None:
            raise RuntimeError("this rank has no evaluation network (its build failed)")
        provenance = evaluator.load_only(Path(path), kind)
    except Exception as exc:  # noqa: BLE001 - every rank must answer, whatever happened to it
        code, text, error = status_of(exc), str(exc), exc
    statuses, _ = group.answer(code, text)
    return statuses, error, provenance


def _scorer_for(scorers: dict, evaluator: Evaluator | None, settings: Mapping[str, Any]) -> Any:
    """This rank's TokenScorer of a suite's shape (built, and compiled, at its first share)."""
    if evaluator is None:
        return None
    from evald.pipeline.engine import TokenScorer

    key = json.dumps(settings, sort_keys=True)
    if key not in scorers:
        scorers[key] = TokenScorer(evaluator.network, max_length=settings["max_length"],
                                   batch_size=settings["batch_size"], lengths=settings["lengths"],
                                   top_k=int(settings.get("top_k", 0)),
                                   fork_contexts=bool(settings.get("fork_contexts", True)),
                                   fork_piece=int(settings.get("fork_piece", 0)) or None,
                                   read_widths=settings.get("read_widths") or None,
                                   row_caps=settings.get("row_caps") or None,
                                   cache_caps=settings.get("cache_caps") or None)
    return scorers[key]


def follow(group: Group) -> int:
    """The loop of every rank but 0: answer rank 0's commands until it says EXIT."""
    evaluator: Evaluator | None = None
    scorers: dict[str, Any] = {}
    while True:
        op, payload = group.receive()
        if op == EXIT:
            log.info("rank %d: rank 0 ended the group", group.rank)
            return 0
        if op == BUILD:
            evaluator, code, text = None, OK, ""
            try:
                evaluator = build_local(payload, (group.rank, group.size))  # type: ignore[arg-type]
            except Exception as exc:  # noqa: BLE001 - rank 0 waits for this answer
                log.exception("rank %d: building the evaluation network failed", group.rank)
                code, text = ERROR, f"{type(exc).__name__}: {exc}"
            group.answer(code, text)
        elif op == EVALUATE:
            assert payload is not None
            statuses, _, part, _ = evaluate_part(evaluator, group, payload["path"], payload["kind"], never)
            code, text = statuses[group.rank]
            log.info("rank %d: evaluated my part of %s (load %.3fs): %s", group.rank, Path(payload["path"]).name,
                     part.load_s if part is not None else 0.0, "ok" if code == OK else text)
        elif op == SWAP:
            assert payload is not None
            swap_share(evaluator, group, payload["path"], payload["kind"])
        elif op == SCORE:
            assert payload is not None
            score_share(_scorer_for(scorers, evaluator, payload["scorer"]), group, payload)
        elif op == GENERATE:
            assert payload is not None
            generate_share(_scorer_for(scorers, evaluator, payload["scorer"]), group, payload)
        elif op == WARM:
            assert payload is not None
            warm_share(_scorer_for(scorers, evaluator, payload["scorer"]), group, payload)
        elif op not in OP_NAMES:
            raise AssertionError(op)
