"""Trainer side of evald: snapshot, notify, report health, obey early stop.

``EvaldHook`` works in any loop; ``EvaldCallback`` plugs it into ``Model.train``;
``TrainStepWithGradNorm`` is a train-step Cell that also returns the global
gradient norm (MindSpore 2.10 has no call that does).
"""

from trainer_hooks.hook import EvaldHook

__all__ = ["EvaldHook", "EvaldCallback", "TrainStepWithGradNorm", "ScaleLearningRate"]


def __getattr__(name: str):
    # Lazy: importing the plain hook must not import mindspore.
    if name == "EvaldCallback":
        from trainer_hooks.callback import EvaldCallback

        return EvaldCallback
    if name == "TrainStepWithGradNorm":
        from trainer_hooks.train_step import TrainStepWithGradNorm

        return TrainStepWithGradNorm
    if name == "ScaleLearningRate":
        from trainer_hooks.lr_advice import ScaleLearningRate

        return ScaleLearningRate
    raise AttributeError(name)
