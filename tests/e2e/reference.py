"""In-process references for the served answers: a checkpoint's weights in a fresh demo network, scored
in PyNative with the exact, unpadded sequence (independent of evald's TokenScorer, buckets and HTTP);
and the reference for a reported eval/loss (``mean_token_loss``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import mindspore as ms


def network_at(ckpt_dir: Path, step: int):
    """The demo model holding step ``step``'s weights, read by evald's verified loader."""
    import mindspore as ms

    from evald.contracts import layout
    from evald.pipeline.swap.hot_swap import NetworkWeights
    from examples.tiny_lm.model import build_model

    ms.set_context(mode=ms.PYNATIVE_MODE)
    net = build_model(seq_len=64)
    net.set_train(False)
    step_dir = ckpt_dir / layout.step_dir_name(step)
    NetworkWeights(net).load(step_dir, layout.read_manifest(step_dir))
    return net


def logprobs(net, tokens: list[int]) -> np.ndarray:
    """log p(tokens[i] | tokens[:i]) for i >= 1, float32 as MindSpore computes it."""
    import mindspore as ms

    logits = net(ms.Tensor(np.asarray([tokens[:-1]], np.int32)))
    logp = ms.ops.log_softmax(logits.astype(ms.float32), -1).asnumpy()[0]
    return logp[np.arange(len(tokens) - 1), np.asarray(tokens[1:])]


def mean_token_loss(net: ms.nn.Cell, windows: np.ndarray, batch_size: int) -> float:
    """The loss evald's eval/loss is held to, computed independently: float64 log-softmax in numpy, own batching."""
    import mindspore as ms

    total, count = 0.0, 0
    for start in range(0, len(windows), batch_size):
        batch = windows[start:start + batch_size]
        logits = net(ms.Tensor(batch[:, :-1])).asnumpy().astype(np.float64)
        shifted = logits - logits.max(-1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
        targets = batch[:, 1:]
        total -= np.take_along_axis(log_probs, targets[..., None], -1).sum()
        count += targets.size
    return total / count


def reference_lm(net):
    """lm-eval's TemplateLM over ``net`` (byte tokens, EOS 0 as prefix): lm-eval's own request handling."""
    from lm_eval.api.model import TemplateLM

    class PyNativeLM(TemplateLM):
        @property
        def eot_token_id(self) -> int:
            return 0

        @property
        def max_length(self) -> int:
            return 64

        def tok_encode(self, string, **kwargs):
            return list(string.encode("utf-8"))

        def _loglikelihood_tokens(self, requests, disable_tqdm=False, **kwargs):
            out = []
            for _, context, continuation in requests:
                whole = (list(context) + list(continuation))[-65:]
                values = logprobs(net, whole)[-len(continuation):]
                out.append((float(np.sum(values, dtype=np.float64)), False))
            return out

        def loglikelihood_rolling(self, requests, disable_tqdm=False):
            raise NotImplementedError

        def generate_until(self, requests, disable_tqdm=False):
            raise NotImplementedError

    return PyNativeLM()
