"""The evaluation network: built and compiled once, then fed each checkpoint's weights.

Swapping weights into a compiled network does not recompile, while building and compiling
a fresh network takes seconds; evald.hot_swap reads checkpoint files straight into the
parameters' memory. Batches keep one shape, so the graph compiles exactly once, when the
Evaluator is built.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from evald.checkpoints import CheckpointError
from evald.contracts.wire import FactorySpec
from evald.factories import call_factory
from evald.hot_swap import NetworkWeights
from evald.subset import SubsetInfo, fixed_batches, select_subset
from evald.tasks import DataShapeError, ShouldAbort, make_task, never
from evald.weights import load_into

log = logging.getLogger("evald.evaluator")


@dataclass(frozen=True)
class EvalResult:
    metrics: dict[str, float]
    texts: dict[str, str]
    load_s: float
    evaluate_s: float


class Evaluator:
    def __init__(self, *, task: str, model: FactorySpec, data: FactorySpec, subset_size: int,
                 subset_seed: int, batch_size: int, plugins: Sequence[Any] = (), generation: Any = None) -> None:
        import mindspore as ms

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
        self.network = call_factory(model, "model")
        if not hasattr(self.network, "parameters_and_names"):
            raise TypeError(f"the model factory {model.target!r} returned {type(self.network).__name__}, "
                            f"not a mindspore.nn.Cell")
        self.network.set_train(False)
        self.cell = self.task.build_cell(self.network)
        self.cell.set_train(False)
        self.weights = NetworkWeights(self.network)
        self.generation = generation
        if generation is not None:
            generation.prepare(self.network, dataset, indices)
        self.task.evaluate(self.cell, self.batches[:1])  # compile now, not at the first checkpoint
        if generation is not None:
            generation.run()
        log.info("evaluation network ready in %.1fs: %d parameters (%s); %s", time.time() - started,
                 len(self.weights.specs), "read in place" if self.weights.in_place else "set_data",
                 self.subset.describe())

    def evaluate(self, path: Path, kind: str, should_abort: ShouldAbort = never) -> EvalResult:
        """Swap in the checkpoint at ``path`` and evaluate it; CheckpointError if it is bad."""
        started = time.time()
        load_into(self.weights, path, kind)
        if not self.weights.valid:  # never evaluate a network that holds two checkpoints' weights
            raise CheckpointError(f"{path.name}: the swap did not complete")
        loaded = time.time()
        metrics = self.task.evaluate(self.cell, self.batches, should_abort)
        texts: dict[str, str] = {}
        if self.generation is not None:
            gen_metrics, gen_texts = self.generation.run(should_abort)
            metrics.update(gen_metrics)
            texts.update(gen_texts)
        return EvalResult(metrics, texts, loaded - started, time.time() - loaded)
