"""What the train cell tells EvaldCallback: the model inside it, what its step returned, its step's rate.

**The model.** ``Model.train`` hands callbacks the train cell (``TrainOneStepCell``,
``TrainOneStepWithLossScaleCell``, MindFormers' ``MFTrainOneStepCell``), which holds
besides the model's weights the optimizer's state and loss-scale state (``scale_sense``,
``loss_scaling_manager.*``). A snapshot holds the model's weights only, so without
``network=`` the callback goes down from the train cell to its ``network`` when that holds
every parameter the optimizer trains, then down ``network``/``_backbone`` attributes
(``WithLossCell``, MindFormers' tool cells) while nothing is left behind. If it cannot go
below the cell that holds the optimizer, it cannot tell the weights from the train
cell's other state, and ``model_of`` says which parameters it is unsure of. A loss cell
of other attribute names (``LMLoss(model)``) stays: its prefix (``model.``) is fitted by
evald (evald.pipeline.swap.name_fit).

**The outputs.** ``(loss, grad_norm)`` (trainer_hooks.TrainStepWithGradNorm),
``(loss, overflow, loss_scale)`` (``TrainOneStepWithLossScaleCell``) and MindFormers'
``(loss, overflow, loss_scale, learning_rate, global_norm)`` (4 to 7 items: 4 without
the norm, 7 with its local norms after it).

**The learning rate.** An optimizer reads its schedule at ``global_step`` and then
increments it, so after step N ``optimizer.get_lr()`` returns the rate of step N+1.
``step_learning_rate`` reads the schedule at ``global_step - 1``: the rate step N used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainer_hooks.host_copy import weight_parameters

WRAPPER_ATTRIBUTES = ("network", "_backbone")


@dataclass(frozen=True)
class StepOutputs:
    loss: Any = None
    grad_norm: Any = None
    overflow: Any = None
    loss_scale: Any = None
    learning_rate: Any = None


def step_outputs(outputs: Any) -> StepOutputs:
    """What the train cell returned, by its shape (see the module doc)."""
    if not isinstance(outputs, (tuple, list)):
        return StepOutputs(loss=outputs)
    if len(outputs) == 2:
        return StepOutputs(loss=outputs[0], grad_norm=outputs[1])
    if len(outputs) == 3:
        return StepOutputs(outputs[0], None, outputs[1], outputs[2])
    if len(outputs) in (4, 5, 7):  # MindFormers: loss, overflow, scale, lr[, global norm[, local norm, size]]
        return StepOutputs(outputs[0], outputs[4] if len(outputs) > 4 else None, outputs[1], outputs[2], outputs[3])
    return StepOutputs(loss=outputs[0] if outputs else None)


def optimizer_of(args: Any) -> Any:
    """``Model(net, loss, optimizer)`` fills ``optimizer``; ``Model(train_cell)`` leaves it None, but the
    train cell holds its own."""
    optimizer = args.get("optimizer")
    if optimizer is None:
        optimizer = getattr(args.get("train_network"), "optimizer", None)
    return optimizer


def model_of(train_cell: Any, optimizer: Any) -> tuple[Any, str | None]:
    """The model inside ``train_cell`` and, when its weights cannot be told apart, why (else None).

    Down from the train wrapper (the cell holding ``optimizer``) to its ``network`` if that holds
    every trained parameter; then down ``network``/``_backbone`` while nothing is left behind
    (a ``WithLossCell``'s loss has no parameters; a buffer such as BatchNorm's statistics is kept).
    """
    trained = {id(p) for p in (optimizer.parameters if optimizer is not None else train_cell.trainable_params())}
    cell, child = train_cell, _wrapped(train_cell)
    if child is not None and getattr(train_cell, "optimizer", None) is not None and trained <= _ids(child):
        cell = child
        while (child := _wrapped(cell)) is not None and _ids(cell) <= _ids(child):
            cell = child
    if cell is not train_cell:
        return cell, None
    unsure = [name for name, p in weight_parameters(cell, optimizer) if id(p) not in trained]
    if optimizer is not None and not unsure:
        return cell, None
    what = (f"{len(unsure)} parameter(s) the optimizer does not train: {_few(unsure)}" if optimizer is not None
            else "no optimizer was found, so its state cannot be left out either")
    return cell, (f"EvaldCallback cannot tell the model's weights from other state in {type(train_cell).__name__} "
                  f"(no network/_backbone attribute holding every trained parameter): the snapshots hold {what}. "
                  f"If these are not the model's own (loss-scale state, counters), evald cannot evaluate them: "
                  f"pass network=<the model> to EvaldCallback")


def step_learning_rate(optimizer: Any) -> Any:
    """The learning rate the optimizer applied at the step that just ended (None if unknown)."""
    if optimizer is None:
        return None
    if not getattr(optimizer, "dynamic_lr", False):
        return optimizer.get_lr()
    import mindspore as ms
    import numpy as np

    applied = max(int(np.asarray(optimizer.global_step.asnumpy()).reshape(-1)[0]) - 1, 0)
    schedule = optimizer.learning_rate[0] if optimizer.is_group_lr else optimizer.learning_rate
    return schedule(ms.Tensor([applied], ms.int32)).reshape(())


def _wrapped(cell: Any) -> Any:
    from mindspore import nn

    return next((c for c in (getattr(cell, a, None) for a in WRAPPER_ATTRIBUTES) if isinstance(c, nn.Cell)), None)


def _ids(cell: Any) -> set[int]:
    return {id(p) for p in cell.get_parameters()}


def _few(names: list[str], limit: int = 6) -> str:
    return "[" + ", ".join(names[:limit]) + (", …" if len(names) > limit else "") + "]"
