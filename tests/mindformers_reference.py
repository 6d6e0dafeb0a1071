"""The in-process evaluation of MindFormers' own weights files, for tests/e2e/test_mindformers_recipe.py.

Run with the MindFormers venv's python (scripts/setup_mindformers.sh), from the recipe's directory:

    python tests/mindformers_reference.py LLAMA_JSON SUBSET_JSON FILE [FILE ...]

It builds the model with the page's own factory (``mypkg.eval_model:build`` with ``LLAMA``), loads
each weights-only file with MindSpore's ``load_checkpoint`` and ``load_param_into_net`` (strict: no
network parameter left out, no file entry unused), runs the page's validation rows of the subset
evald recorded, and computes the token-weighted mean loss in float64 from the logits, outside
evald's cell, batches and hot swap. It prints ``{file: {"loss": ..., "parameters": N}}`` as JSON.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np


def main(argv: list[str]) -> int:
    llama, subset, files = json.loads(Path(argv[0]).read_text()), json.loads(Path(argv[1]).read_text()), argv[2:]
    import mindspore as ms

    ms.set_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)
    sys.path.insert(0, ".")
    from mypkg.eval_data import validation
    from mypkg.eval_model import build

    net = build(**llama)
    net.set_train(False)
    rows = np.asarray(validation(seq_length=llama["seq_length"], vocab_size=llama["vocab_size"]))[subset["indices"]]
    batch = llama["batch_size"]
    assert len(rows) % batch == 0, "the subset fills whole batches (256 rows, batch 2)"
    results = {}
    for name in files:
        weights = ms.load_checkpoint(name)
        prefixed = {f"net.{key}": value for key, value in weights.items()}  # the page's Logits wrapper
        not_loaded, unused = ms.load_param_into_net(net, prefixed, strict_load=True)
        if not_loaded or unused:
            raise SystemExit(f"{name}: the model and the file disagree: not loaded {not_loaded}, unused {unused}")
        total, tokens = 0.0, 0
        for start in range(0, len(rows), batch):
            window = rows[start:start + batch]
            logits = net(ms.Tensor(window[:, :-1], ms.int32)).asnumpy().astype(np.float64)
            shifted = logits - logits.max(-1, keepdims=True)
            log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
            targets = window[:, 1:]
            total -= np.take_along_axis(log_probs, targets[..., None], -1).sum()
            tokens += targets.size
        results[name] = {"loss": total / tokens, "parameters": len(weights)}
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
