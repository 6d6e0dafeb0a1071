"""Which entries of a foreign checkpoint are the optimizer's or the loss scale's state, not weights.

A full training checkpoint (MindSpore's ``ModelCheckpoint`` of a train cell, MindFormers'
``checkpoint/rank_N/`` files) holds, beside the weights, state that no evaluation network
has. Only such state may be left out when a foreign file is swapped in; any other entry
that is not in the network fails the step (docs/mindformers.md, "Which entries of a
checkpoint may be left out"). The rule, by name only:

* a moment: ``<moment>.<name>`` where ``<moment>`` is one of MOMENTS (the prefixes
  MindSpore's and MindFormers' optimizers clone their parameters with) and ``<name>`` is
  a weight's name: an entry of the same file, with or without the prefix a train cell
  puts on every weight (``adam_m.w`` beside ``model.w``), or a network parameter's name;
* a bookkeeping scalar named exactly as in SCALARS (``global_step``, ``scale_sense``, …),
  or any entry under ``loss_scaling_manager.``.

A MindFormers weights-only file (``checkpoint_network/``) holds none of these: it is read
strictly (evald.pipeline.swap.weights). Pure; imports nothing of evald.
"""

from __future__ import annotations

from typing import Collection

# mindspore.nn / mindspore.experimental.optim (``parameters.clone(prefix=...)``) and MindFormers' AdamW.
MOMENTS = frozenset({
    "adam_m", "adam_v", "moment1", "moment2", "moments", "moment", "exp_avg", "exp_avg_sq",
    "max_exp_avg_sq", "exp_inf", "vhat", "accum", "accum_update", "accu_grads", "linear", "mean_grad",
    "mean_square", "lamb_m", "lamb_v", "prev", "step_size", "stat", "ax",
})
# The optimizer's and the loss-scale cell's own parameters, and what ModelCheckpoint/MindFormers append.
SCALARS = frozenset({
    "global_step", "learning_rate", "scale_sense", "loss_scale", "beta1_power", "beta2_power",
    "epoch_num", "step_num", "cur_epoch_num", "cur_step_num", "current_iterator_step",
    "last_overflow_iterator_step",
})
LOSS_SCALE_PREFIX = "loss_scaling_manager."


def is_training_state(name: str, weight_names: Collection[str]) -> bool:
    """True when the checkpoint entry ``name`` is optimizer or loss-scale state; a moment must be of one of
    ``weight_names`` (the names a weight of the file may go by)."""
    if name in SCALARS or name.startswith(LOSS_SCALE_PREFIX):
        return True
    moment, dot, weight = name.partition(".")
    return bool(dot) and moment in MOMENTS and weight in weight_names


def rule() -> str:
    """The rule in one sentence, for error messages."""
    return ("entries not in the network are allowed only as optimizer or loss-scale state "
            "(a moment such as 'adam_m.<weight>', or 'global_step', 'scale_sense', …)")
