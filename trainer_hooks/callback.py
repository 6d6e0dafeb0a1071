"""EvaldCallback: EvaldHook as a ``mindspore.train.Callback`` for ``Model.train``.

::

    from trainer_hooks import EvaldCallback
    model.train(epochs, dataset, callbacks=[EvaldCallback(ckpt_dir="runs/exp1/ckpt",
                                                          every_n_steps=100, total_steps=...)])

It reads the step, epoch, loss (and gradient norm, loss scale or overflow when
the train cell returns them as a tuple ``(loss, grad_norm)`` or
``(loss, overflow, scale)``) from the run context, and calls
``run_context.request_stop()`` when evald's stop decision has been agreed on
by every rank.
"""

from __future__ import annotations

import logging
from typing import Any

from mindspore.train import Callback

from trainer_hooks.hook import EvaldHook

log = logging.getLogger("trainer_hooks")


class EvaldCallback(Callback):
    """``EvaldHook`` as a ``mindspore.train.Callback``: evald beside ``Model.train`` (or any trainer
    that takes MindSpore callbacks, such as MindFormers' ``Trainer(callbacks=[...])``).

    Args:
        ckpt_dir: where snapshots are committed; evald watches this directory.
        every_n_steps: take a snapshot every this many steps.
        batch_size: samples per step, for the throughput evald reports (optional).
        tokens_per_sample: tokens per sample, for tokens per second (optional).
        **hook_kwargs: any other ``EvaldHook`` argument (``network``, ``model_factory``,
            ``data_factory``, ``total_steps``, ``keep_last``, ``lr_advice_handler``...).

    Returns:
        Nothing: when evald's stop decision has been agreed on by every rank, the callback calls
        ``run_context.request_stop()`` and training ends at that step on every rank.

    Example::

        model = Model(TrainStepWithGradNorm(loss_net, optimizer))
        model.train(epochs, dataset, callbacks=[EvaldCallback(
            "runs/exp1/ckpt", every_n_steps=500, network=net, total_steps=total,
            model_factory="mypkg.model:build", data_factory="mypkg.data:val_set")])
    """

    def __init__(self, ckpt_dir: str, every_n_steps: int = 100, *, batch_size: int | None = None,
                 tokens_per_sample: int | None = None, **hook_kwargs: Any) -> None:
        super().__init__()
        self.hook = EvaldHook(ckpt_dir, every_n_steps, **hook_kwargs)
        self.batch_size = batch_size
        self.tokens_per_sample = tokens_per_sample
        self._last_step = 0

    def on_train_step_end(self, run_context) -> None:
        try:
            args = run_context.original_args()
            step = int(args.cur_step_num)
            self._last_step = step
            loss, grad_norm, overflow, loss_scale = _unpack_outputs(args.get("net_outputs"))
            optimizer = _optimizer_of(args)
            samples = self.batch_size
            tokens = samples * self.tokens_per_sample if samples and self.tokens_per_sample else None
            stop = self.hook.step_end(
                step, network=self.hook.network or args.get("train_network") or args.get("network"),
                optimizer=optimizer, epoch=args.get("cur_epoch_num"), loss=loss,
                lr=_current_lr(optimizer), grad_norm=grad_norm, loss_scale=loss_scale,
                overflow=overflow, samples=samples, tokens=tokens,
            )
            if stop:
                run_context.request_stop()
        except Exception:
            self.hook.errors += 1
            log.exception("EvaldCallback error (ignored; training continues)")

    def on_train_end(self, run_context) -> None:
        try:
            args = run_context.original_args()
            step = int(args.get("cur_step_num") or self._last_step)
            self.hook.train_end(step, network=self.hook.network or args.get("train_network") or args.get("network"),
                                optimizer=_optimizer_of(args), epoch=args.get("cur_epoch_num"))
        except Exception:
            self.hook.errors += 1
            log.exception("EvaldCallback error at the end of training (ignored)")


def _unpack_outputs(outputs: Any) -> tuple[Any, Any, Any, Any]:
    """(loss, grad_norm, overflow, loss_scale) from what the train cell returned."""
    if isinstance(outputs, (tuple, list)):
        if len(outputs) == 2:
            return outputs[0], outputs[1], None, None
        if len(outputs) == 3:  # TrainOneStepWithLossScaleCell: (loss, overflow, scale)
            return outputs[0], None, outputs[1], outputs[2]
        return (outputs[0] if outputs else None), None, None, None
    return outputs, None, None, None


def _optimizer_of(args: Any) -> Any:
    """Model(net, loss, optimizer) fills ``optimizer``; Model(train_cell) leaves it None, but a
    TrainOneStepCell holds its own. Without it the snapshot would include optimizer state."""
    optimizer = args.get("optimizer")
    if optimizer is None:
        optimizer = getattr(args.get("train_network"), "optimizer", None)
    return optimizer


def _current_lr(optimizer: Any) -> Any:
    if optimizer is None:
        return None
    try:
        lr = optimizer.get_lr()
        return lr
    except Exception:
        return None
