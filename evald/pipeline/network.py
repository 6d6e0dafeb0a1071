"""The evaluation network: built and compiled once, then fed each checkpoint's weights.

Swapping weights into a compiled network does not recompile, while building and compiling
a fresh network takes seconds; evald.pipeline.swap.hot_swap reads checkpoint files straight into the
parameters' memory. Batches keep one shape, so the graph compiles exactly once, when the
Evaluator is built.

In an eval group (evald.pipeline.group.evaluator) each rank's Evaluator is one ``part`` of the work:
every ``size``-th batch of the fixed subset and a slice of the generation prompts, returned by
``evaluate_part`` as full-size arrays with zeros in the other ranks' rows.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from evald.contracts import layout
from evald.contracts.wire import FactorySpec
from evald.files.recognise import CheckpointError
from evald.contracts.manifest import numpy_dtype_of
from evald.pipeline import memory_fit
from evald.pipeline.factories import call_factory
from evald.pipeline.swap.hot_swap import NetworkWeights
from evald.pipeline.subset import SubsetInfo, fixed_batches, select_subset
from evald.pipeline.swap.swap_check import PartsRead, check as check_swap, check_parts, parts_digest, weights_digest
from evald.pipeline.tasks import make_task
from evald.pipeline.tasks.base import DataShapeError, ShouldAbort, never
from evald.pipeline.swap.tp_load import read_rank
from evald.pipeline.swap.weights import load_into

# A tensor-parallel eval rank's model factory learns its degree and rank from these (docs/eval-group.md).
ENV_TP_DEGREE, ENV_TP_RANK = "EVALD_TP_DEGREE", "EVALD_TP_RANK"

log = logging.getLogger("evald.pipeline.network")


@dataclass(frozen=True)
class EvalResult:
    metrics: dict[str, float]
    texts: dict[str, str]
    load_s: float
    evaluate_s: float
    verify_s: float = 0.0                                            # proving the swap (evald.pipeline.swap.swap_check)
    provenance: Mapping[str, Any] = field(default_factory=dict)      # which weights, subset and config


@dataclass(frozen=True)
class Held:
    """The checkpoint whose weights the network holds, its swap proven: what served answers name."""

    step: int
    digest: str        # the weights' sha256 (provenance ``weights_sha256``)
    path: Path


@dataclass(frozen=True)
class PartResult:
    """One eval-group rank's share of an evaluation (evald.pipeline.group.evaluator)."""

    arrays: dict[str, np.ndarray]   # full-size, zeros in the other ranks' rows
    load_s: float
    verify_s: float
    provenance: Mapping[str, Any]


class Evaluator:
    def __init__(self, *, task: str, model: FactorySpec, data: FactorySpec, subset_size: int,
                 subset_seed: int, batch_size: int, plugins: Sequence[Any] = (), generation: Any = None,
                 part: tuple[int, int] = (0, 1), verify_swap: str = "sampled",
                 config_identity: Mapping[str, Any] | None = None,
                 tensor_parallel: tuple[int, int] = (1, 0), keep_alive: Callable[[], None] = lambda: None) -> None:
        """``keep_alive`` is called between the build's steps (its graphs compile for seconds each): the caller
        keeps its outputs alive meanwhile (evald republishes its control state, whose leases the trainer obeys)."""
        import mindspore as ms

        self.tensor_parallel = tensor_parallel  # (degree, this rank): the rank holds its shard of the model
        self._ms = ms
        started = time.time()
        self.task = make_task(task, plugins=plugins, generation=generation)
        dataset = call_factory(data, "data")
        try:
            size = len(dataset)
        except TypeError:
            raise DataShapeError(f"the data factory {data.target!r} returned {type(dataset).__name__}, which has "
                                 f"no len(); return a sequence or an array of validation items") from None
        if size == 0:
            raise DataShapeError(f"the data factory {data.target!r} returned an empty validation set")
        self.task.check_item(dataset[0])
        indices = select_subset(size, subset_size, subset_seed)
        for i in indices:
            self.task.check_item(dataset[int(i)])
        self.subset = SubsetInfo.of(indices, num_samples=size, requested=subset_size, seed=subset_seed)
        self.batches = fixed_batches(dataset, indices, batch_size)
        rank, size = part
        self.part_batches = self.batches[rank::size]  # whole batches: the same rows, shapes and values
        self.part_rows = np.concatenate([np.arange(b * batch_size, b * batch_size + int(batch.weights.sum()))
                                         for b, batch in enumerate(self.batches)][rank::size] or [np.zeros(0, int)])
        degree, tp_rank = tensor_parallel
        os.environ[ENV_TP_DEGREE], os.environ[ENV_TP_RANK] = str(degree), str(tp_rank)  # the factory reads them
        self.network = call_factory(model, "model")
        if not hasattr(self.network, "parameters_and_names"):
            raise TypeError(f"the model factory {model.target!r} returned {type(self.network).__name__}, "
                            f"not a mindspore.nn.Cell")
        self.network.set_train(False)
        self._check_memory(ms)
        self.cell = self.task.build_cell(self.network)
        self.cell.set_train(False)
        self.weights = NetworkWeights(self.network)
        self.verify_swap, self.config_identity = verify_swap, dict(config_identity or {})
        self.generation = generation
        self.held: Held | None = None   # None while a swap is under way or after one failed
        if generation is not None:
            generation.prepare(self.network, dataset, indices, part=part)
        keep_alive()
        sample = self.task.outputs(self.cell, self.batches[:1])  # compile now, not at the first checkpoint
        self.layout = {name: ((len(indices),) + values.shape[1:], values.dtype) for name, values in sample.items()}
        keep_alive()
        if generation is not None:
            generation.outputs(lambda: keep_alive() or False)   # before each step: its graphs compile at the first
            self.layout.update({f"gen/{name}": spec for name, spec in generation.layout().items()})
        log.info("evaluation network ready in %.1fs: %d parameters (%s); %s", time.time() - started,
                 len(self.weights.specs), "read in place" if self.weights.in_place else "set_data",
                 self.subset.describe())

    def _check_memory(self, ms: Any) -> None:
        """Refuse, before compiling, weights that cannot fit the device (evald.pipeline.memory_fit)."""
        from evald.pipeline.swap.weights import network_bytes

        target = ms.get_context("device_target")
        device_id = int(ms.get_context("device_id") or 0)
        degree = self.tensor_parallel[0]
        params = dict(self.network.parameters_and_names())
        weight_bytes = network_bytes({n: (tuple(p.shape), numpy_dtype_of(p.dtype)) for n, p in params.items()})
        problem = memory_fit.fit_problem(weight_bytes, memory_fit.device_memory(target, device_id), degree=degree,
                                         device=f"{target}:{device_id}")
        if problem:
            raise ValueError(problem)

    def swap_in(self, path: Path, kind: str, step: int | None = None) -> tuple[dict[str, Any], float, float]:
        """Swap in the checkpoint at ``path`` and prove it: (provenance, load seconds, verify seconds).
        ``held`` names it afterwards (``step``, else the manifest's); None while the swap is under way."""
        self.held = None
        started = time.time()
        if self.tensor_parallel[0] > 1:
            source = self._load_shard(path, kind)
        else:
            source = load_into(self.weights, path, kind)
        if not self.weights.valid:  # never evaluate a network that holds two checkpoints' weights
            raise CheckpointError(f"{path.name}: the swap did not complete")
        loaded = time.time()
        provenance = self._check_swap(path, source)
        if step is None:
            step = source.step if isinstance(source, layout.Manifest) else 0
        self.held = Held(int(step), str(provenance["weights_sha256"]), path)
        return provenance, loaded - started, time.time() - loaded

    def _load_shard(self, path: Path, kind: str) -> dict[str, np.ndarray]:
        """This tensor-parallel rank's slice of every parameter, only their bytes (evald.pipeline.swap.tp_load)."""
        degree, rank = self.tensor_parallel
        self.weights.valid = False   # read into the live parameters: a failed read leaves a mix
        read = read_rank(path, kind, self.weights.specs, degree, rank, into=self.weights.destinations(),
                         share=(rank, degree))   # the group verifies every file once: this rank its share
        self.weights.assign(read.arrays)   # nothing to copy for what was read in place
        self.weights.valid = True
        log.info("rank %d of %d: read %d bytes of %s, its slices only; verified %d bytes (%d files, its share)",
                 rank, degree, read.bytes_read, path.name, read.bytes_verified, len(read.files_verified))
        return read.arrays

    def evaluate(self, path: Path, kind: str, should_abort: ShouldAbort = never, step: int | None = None
                 ) -> EvalResult:
        """Swap in the checkpoint at ``path`` and evaluate it; CheckpointError if it is bad."""
        provenance, load_s, verify_s = self.swap_in(path, kind, step)
        verified = time.time()
        # past this line a first signal lets the evaluation finish (before it, the read stops: exit 1)
        log.debug("%s swapped in (load %.3fs, verify %.3fs): evaluating", path.name, load_s, verify_s)
        metrics = self.task.evaluate(self.cell, self.batches, should_abort)
        texts: dict[str, str] = {}
        if self.generation is not None:
            gen_metrics, gen_texts = self.generation.run(should_abort)
            metrics.update(gen_metrics)
            texts.update(gen_texts)
        return EvalResult(metrics, texts, load_s, time.time() - verified, verify_s, provenance)

    def load_only(self, path: Path, kind: str, step: int | None = None) -> dict[str, Any]:
        """Only load and prove the checkpoint at ``path`` (for a benchmark suite of a step whose
        validation was done earlier); its provenance. CheckpointError if it is bad."""
        return self.swap_in(path, kind, step)[0]

    def evaluate_part(self, path: Path, kind: str, should_abort: ShouldAbort = never,
                      after_swap: Callable[[], None] = lambda: None) -> PartResult:
        """This rank's part as full-size arrays (``layout``), zeros in other ranks' rows. ``after_swap``: a
        tensor-parallel group's agreement that every rank swapped in (evald.pipeline.group.evaluator)."""
        provenance, load_s, verify_s = self.swap_in(path, kind)  # every rank proves its own swap
        after_swap()
        full = {name: np.zeros(shape, dtype) for name, (shape, dtype) in self.layout.items()}
        if self.part_batches:
            for name, values in self.task.outputs(self.cell, self.part_batches, should_abort).items():
                full[name][self.part_rows] = values
        if self.generation is not None:
            for name, values in self.generation.outputs(should_abort).items():
                full[f"gen/{name}"][self.generation.local_rows] = values
        return PartResult(full, load_s, verify_s, provenance)

    def metrics_of(self, full: dict[str, np.ndarray]) -> tuple[dict[str, float], dict[str, str]]:
        """Metrics and texts from the whole subset's arrays, exactly as ``evaluate`` computes them."""
        metrics = self.task.metrics({k: v for k, v in full.items() if not k.startswith("gen/")})
        texts: dict[str, str] = {}
        if self.generation is not None:
            gen_metrics, texts = self.generation.report({k[4:]: v for k, v in full.items() if k.startswith("gen/")})
            metrics.update(gen_metrics)
        return metrics, texts

    def _check_swap(self, path: Path, source: Any) -> dict[str, Any]:
        """Prove the swap (SwapMismatch, an evald error, if the network does not hold the checkpoint's
        weights) and say what was evaluated: the weights' digest, the subset and the config."""
        manifest = source if isinstance(source, layout.Manifest) else None
        loaded = None if manifest is not None or isinstance(source, PartsRead) else source
        params = dict(self.network.parameters_and_names())
        try:
            if isinstance(source, PartsRead):
                done = check_parts(params, mode=self.verify_swap, step=source.members[0][1].step, parts=source)
            else:
                done = check_swap(params, mode=self.verify_swap, step=manifest.step if manifest else 0,
                                  step_dir=path, manifest=manifest, loaded=loaded)
        except Exception:
            self.weights.valid = False  # evaluate nothing until a later swap succeeds
            raise
        digest, digest_of = parts_digest(source) if isinstance(source, PartsRead) else weights_digest(manifest,
                                                                                                       loaded)
        return {"weights_sha256": digest, "weights_digest_of": digest_of, "subset_sha256": self.subset.sha256,
                "config": self.config_identity, "swap_check": done.describe()}
