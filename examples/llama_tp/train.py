"""Train examples/llama_tp tensor-parallel on every rank of an msrun job, with EvaldHook writing parts.

    msrun --worker_num=4 --local_worker_num=4 --master_port=PORT --join=True \\
        examples/llama_tp/train.py CKPT_DIR [--steps 20] [--every 10]
    python examples/llama_tp/train.py CKPT_DIR        # one device: the same training, replayed whole

Every rank holds 1/N of every tensor-parallel weight (``build_model(degree=N, rank=r)``) and sees the
same batches; the loss is the vocabulary-parallel NLL (``vocab_parallel_nll``), the only collective
AllReduce SUM. ``EvaldHook(tensor_layouts=...)`` on every rank writes each snapshot as N parts: each
rank its slices (with their layouts) and a share of the replicated weights. Each rank prints
``step S loss L`` lines.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

MODEL = {"vocab": 256, "hidden": 64, "layers": 2, "heads": 4, "ffn": 128, "seq_len": 64}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("ckpt_dir")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--batch", type=int, default=4)
    args = parser.parse_args(argv)

    import mindspore as ms
    from mindspore import nn

    ms.set_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)
    degree, rank = 1, 0
    import os
    if int(os.environ.get("MS_WORKER_NUM", "1")) > 1:
        from mindspore.communication import get_group_size, get_rank, init

        init()
        degree, rank = get_group_size(), get_rank()

    from examples.llama_tp.model import cut_dim, build_model, vocab_parallel_nll
    from examples.tiny_lm.data import training_windows
    from trainer_hooks import EvaldHook

    net = build_model(**MODEL, seed=0, degree=degree, rank=rank)

    class Loss(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.net = net

        def construct(self, tokens):
            return vocab_parallel_nll(self.net, self.net.local_logits(tokens[:, :-1]), tokens[:, 1:])

    optimizer = nn.SGD(net.trainable_params(), learning_rate=0.05)
    step_cell = nn.TrainOneStepCell(Loss(), optimizer)
    layouts = {}
    for name, param in net.parameters_and_names():
        dim = cut_dim(name.rpartition(".")[2] if "." in name else name)
        if dim is not None and degree > 1:
            layouts[name] = {"dev_matrix": [degree], "tensor_map": [0 if d == dim else -1 for d in range(len(param.shape))]}
    hook = EvaldHook(args.ckpt_dir, every_n_steps=args.every, network=net, optimizer=optimizer, run_id="llama-tp",
                     model_factory={"target": "examples.llama_tp.model:build_model", "kwargs": MODEL},
                     data_factory={"target": "examples.tiny_lm.data:validation_windows", "kwargs": {"seq_len": 64}},
                     total_steps=args.steps, tensor_layouts=layouts or None, obey_stop=False)
    windows = training_windows(args.steps * args.batch, seq_len=64, seed=0)
    for step in range(1, args.steps + 1):
        batch = ms.Tensor(windows[(step - 1) * args.batch:step * args.batch])
        loss = float(step_cell(batch).asnumpy())
        print(f"rank {rank} of {degree}: step {step} loss {loss:.9g}", flush=True)
        hook.step_end(step, loss=loss)
    hook.train_end(args.steps)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
