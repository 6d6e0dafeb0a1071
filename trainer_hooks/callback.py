"""EvaldCallback: EvaldHook as a ``mindspore.train.Callback`` for ``Model.train``.

::

    from trainer_hooks import EvaldCallback
    model.train(epochs, dataset, callbacks=[EvaldCallback(ckpt_dir="runs/exp1/ckpt",
                                                          every_n_steps=100, total_steps=...)])

It reads the step, epoch, loss (and gradient norm, loss scale, overflow or learning
rate when the train cell returns them: ``(loss, grad_norm)``, ``(loss, overflow,
scale)`` or MindFormers' ``(loss, overflow, scale, lr, global_norm)``) from the run
context, the learning rate the step used, and calls ``run_context.request_stop()``
when evald's stop decision has been agreed on by every rank. Without ``network=`` it
snapshots the model found inside the train cell (trainer_hooks.train_cell), and says
so at the first step when it cannot tell the model's weights from other state.
Every other keyword argument goes to EvaldHook, e.g. the CURVE keys for an evald on
another host: ``client_key=``, ``server_public_key=`` (or ``EVALD_CLIENT_KEY``,
``EVALD_SERVER_PUBLIC_KEY``; docs/authentication.md).
"""

from __future__ import annotations

import logging
from typing import Any

from mindspore.train import Callback

from trainer_hooks.hook import EvaldHook
from trainer_hooks.train_cell import model_of, optimizer_of, step_learning_rate, step_outputs

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
        self._model: tuple[int, Any] | None = None  # (id of the train cell, the model inside it)
        self.weights_warning: str | None = None     # why the snapshots may hold more than the weights

    def on_train_step_end(self, run_context) -> None:
        try:
            args = run_context.original_args()
            step = int(args.cur_step_num)
            self._last_step = step
            out = step_outputs(args.get("net_outputs"))
            optimizer = optimizer_of(args)
            samples = self.batch_size
            tokens = samples * self.tokens_per_sample if samples and self.tokens_per_sample else None
            lr = out.learning_rate if out.learning_rate is not None else _step_lr(optimizer)
            stop = self.hook.step_end(
                step, network=self._network(args, optimizer), optimizer=optimizer,
                epoch=args.get("cur_epoch_num"), loss=out.loss, lr=lr, grad_norm=out.grad_norm,
                loss_scale=out.loss_scale, overflow=out.overflow, samples=samples, tokens=tokens,
            )
            if stop:
                run_context.request_stop()
        except Exception:
            self.hook.count_error()
            log.exception("EvaldCallback error (ignored; training continues)")

    def on_train_end(self, run_context) -> None:
        try:
            args = run_context.original_args()
            step = int(args.get("cur_step_num") or self._last_step)
            optimizer = optimizer_of(args)
            self.hook.train_end(step, network=self._network(args, optimizer), optimizer=optimizer,
                                epoch=args.get("cur_epoch_num"))
        except Exception:
            self.hook.count_error()
            log.exception("EvaldCallback error at the end of training (ignored)")

    def _network(self, args: Any, optimizer: Any) -> Any:
        """``network=`` if given, else the model inside the train cell (found once per train cell)."""
        if self.hook.network is not None:
            return self.hook.network
        train_cell = args.get("train_network") or args.get("network")
        if train_cell is None:
            return None
        if self._model is None or self._model[0] != id(train_cell):
            model, self.weights_warning = model_of(train_cell, optimizer)
            self._model = (id(train_cell), model)
            if self.weights_warning:
                log.warning("%s", self.weights_warning)
        return self._model[1]


def _step_lr(optimizer: Any) -> Any:
    try:
        return step_learning_rate(optimizer)
    except Exception:  # an exotic schedule: no rate rather than an error in the training loop
        return None
