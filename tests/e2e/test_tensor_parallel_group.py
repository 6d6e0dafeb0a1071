"""`evald --device 0,1,2,3 --tensor-parallel 4`: one evaluation on ranks that each hold 1/4 of every
tensor-parallel weight of the LLaMA-style example (examples/llama_tp), as a real msrun group on CPU.
A second snapshot with one byte changed is refused by every degree with one device's reason (each file's
digest is verified by one rank of the group).

The snapshot is evald's partitioned layout written at TP=4 (each part the slices a TP=4 training rank
holds, with their layouts, as EvaldHook(tensor_layouts=...) writes them) of the example's weights.
Evaluated by 1, 2 and 4 tensor-parallel ranks, each reading only its slices: eval/loss equal across the
three (rel <= 1e-6) and equal to an in-process single-device evaluation of the assembled weights; a
benchmark suite (multiple choice and rolling bits per byte) on the same runs: every per-sample
log-likelihood equal across the three (rel <= 1e-6), every greedy flag identical, and the multiple-choice
ones equal to one device's network in process (rel <= 1e-5, as the loss); and a completion served
by each (`--serve`, greedy, echo and log-probabilities): the same tokens, log-probabilities equal (rel <= 1e-6),
and equal to one device's network in process (rel <= 1e-5).
"""

from __future__ import annotations

import gzip
import json
import math
import signal
from pathlib import Path

import numpy as np
import pytest

from evald.contracts import layout
from evald.contracts.partition import PartInfo, SliceSpec, TensorLayout, part_dir_name
from evald.files.slices import tp_region
from examples.tiny_lm.benchmarks import write_benchmarks
from tests import faults
from tests.e2e.reference import mean_token_loss
from tests.harness import run_dir, scalar_points, wait_for

pytestmark = pytest.mark.heavy  # minutes of several processes: CI's third stage (./scripts/test.sh --long)

GROUP_TIMEOUT_S = 900
PROMPT = "import os\nimport"   # served greedily at every degree
MODEL = {"vocab": 256, "hidden": 64, "layers": 2, "heads": 4, "ffn": 128, "seq_len": 64}
FACTORIES = ("--model-factory", "examples.llama_tp.model:build_model", "--model-kwargs", json.dumps(MODEL),
             "--data-factory", "examples.tiny_lm.data:validation_windows", "--data-kwargs", '{"seq_len": 64}')


def _whole_weights() -> dict[str, np.ndarray]:
    import mindspore as ms

    from examples.llama_tp.model import build_model

    ms.set_context(mode=ms.PYNATIVE_MODE)
    net = build_model(**MODEL, seed=7, degree=1, rank=0)
    rng = np.random.default_rng(11)  # not the factory's initial weights: evald must read them
    return {n: (p.asnumpy() + 0.01 * rng.standard_normal(p.shape)).astype(np.float32)
            for n, p in net.parameters_and_names()}


def _write_tp_parts(ckpt: Path, step: int, weights: dict[str, np.ndarray], degree: int) -> None:
    from examples.llama_tp.model import cut_dim

    replicated = [n for n in weights if cut_dim(n.rpartition(".")[2] or n) is None]
    for rank in range(degree):
        part, specs = {}, {}
        for name, array in weights.items():
            dim = cut_dim(name.rpartition(".")[2] if "." in name else name)
            if dim is None:
                if replicated.index(name) % degree == rank:
                    part[name] = array
                continue
            region = tp_region(array.shape, dim, degree, rank)
            part[name] = np.ascontiguousarray(array[tuple(slice(a, b) for a, b in region)])
            specs[name] = SliceSpec(region, array.shape, TensorLayout((degree,),
                                                                      tuple(0 if d == dim else -1
                                                                            for d in range(array.ndim))))
        layout.write_checkpoint(ckpt, step, part, run_id="tp", part=PartInfo(rank, degree, tuple(range(degree))),
                                slices=specs)


def _in_process_network(weights: dict[str, np.ndarray]):
    """The assembled weights in one device's network (degree 1), PyNative."""
    import mindspore as ms

    from examples.llama_tp.model import build_model

    ms.set_context(mode=ms.PYNATIVE_MODE)
    net = build_model(**MODEL, degree=1, rank=0)
    params = dict(net.parameters_and_names())
    for name, array in weights.items():
        params[name].set_data(ms.Tensor(array))
    return net


def in_process_loss(weights: dict[str, np.ndarray], indices: list[int]) -> float:
    """One device, PyNative, float64 log-softmax in numpy, its own batching."""
    from examples.tiny_lm import data

    net = _in_process_network(weights)
    return mean_token_loss(net, data.validation_windows(seq_len=64)[np.asarray(indices)], batch_size=5)


def _responses(run: Path) -> dict[str, list]:
    """Every per-sample file of the run's suites: lm-eval's responses of each document, in doc_id order."""
    found = {}
    for path in sorted((run / "samples").rglob("*.jsonl.gz")):
        lines = gzip.decompress(path.read_bytes()).decode().splitlines()
        docs = sorted((json.loads(line) for line in lines), key=lambda d: d["doc_id"])
        found[str(path.relative_to(run))] = [d["resps"] for d in docs]
    return found


def in_process_loglikelihood(net, context: str, continuation: str) -> float:
    """lm-eval's conventions by hand, as tests/unit/pipeline/test_suites.py (trailing whitespace of the context
    moves to the continuation; left-truncated to max_length + 1; evald's byte tokenizer), float64 sums."""
    import mindspore as ms

    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    ctx, cont = list(context.encode()), list(continuation.encode())
    whole = (ctx + cont)[-65:]
    logits = net(ms.Tensor(np.asarray([whole[:-1]], np.int32))).asnumpy()[0].astype(np.float64)
    shifted = logits - logits.max(-1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    targets = np.asarray(whole[1:])
    return float(np.sum(logp[np.arange(len(targets)), targets][-len(cont):]))


def in_process_greedy(net, prompt: list[int], new: int) -> list[float]:
    """The log-probabilities of the prompt's tokens after the first, then of ``new`` greedy tokens."""
    import mindspore as ms

    def log_probs(tokens: list[int]) -> np.ndarray:
        logits = net(ms.Tensor(np.asarray([tokens], np.int32))).asnumpy()[0].astype(np.float64)
        shifted = logits - logits.max(-1, keepdims=True)
        return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))

    tokens = list(prompt)
    values = [float(v) for v in log_probs(tokens)[np.arange(len(tokens) - 1), tokens[1:]]]
    for _ in range(new):
        last = log_probs(tokens)[-1]
        token = int(np.argmax(last))
        values.append(float(last[token]))
        tokens.append(token)
    return values


def _numbers(responses) -> tuple[list[float], list]:
    """The floats (log-likelihoods) of lm-eval's responses, and everything else (greedy flags) as it is."""
    floats, others = [], []
    if isinstance(responses, list):
        for item in responses:
            f, o = _numbers(item)
            floats += f
            others += o
    elif isinstance(responses, float):
        floats.append(responses)
    else:
        others.append(responses)
    return floats, others


def _completion(url: str, run: str, step: int) -> dict:
    """A greedy completion of ``step`` with the prompt's and the new tokens' log-probabilities."""
    import httpx

    with httpx.Client(base_url=url, timeout=300) as client:
        wait_for(lambda: client.get("/health").json().get("ok"), 300, "/health ok")
        answer = client.post("/v1/completions", json={"model": f"{run}@{step}", "prompt": PROMPT,
                                                      "max_tokens": 6, "temperature": 0, "echo": True, "logprobs": 2})
    assert answer.status_code == 200, answer.text
    [choice] = answer.json()["choices"]
    logprobs = choice["logprobs"]
    return {"text": choice["text"], "tokens": logprobs["tokens"],
            "logprobs": [v for v in logprobs["token_logprobs"] if v is not None]}


def evaluate_at_degrees(tmp_path: Path, procs: list, ckpt: Path, steps: list[int], weights: dict[str, np.ndarray],
                        factories: tuple[str, ...] = FACTORIES, degrees: tuple[int, ...] = (1, 2, 4),
                        refused: dict[int, str] | None = None) -> None:
    """Evaluate every step of ``ckpt`` with 1, 2 and 4 tensor-parallel ranks, each run with a suite
    (multiple choice and rolling bits per byte) and serving; ``weights``: the assembled weights of the last
    step, which is served. Checks: eval/loss, every per-sample log-likelihood and greedy flag, and the
    served completion equal across the degrees (rel 1e-6); the last step's loss, its multiple-choice
    log-likelihoods and the completion equal to one device's network in this process (rel 1e-5).
    ``refused``: steps (not in ``steps``) every degree must record as failed, with the same reason, one
    containing the words given."""
    refused = refused or {}
    include = write_benchmarks(tmp_path / "bench", next_line_count=12, bpb_docs_per_set=2)
    config = tmp_path / "evald.toml"
    config.write_text(f'[suites.mc]\ntasks = ["stdlib_next_line", "bpb_email"]\ninclude_path = ["{include}"]\n'
                      f'batch_size = 4\nmax_length = 64\n')
    common = ["--ckpt-dir", str(ckpt), "--endpoint", "none", "--lag-policy", "all", "--serve-forever",
              "--serve", '{"listen": "127.0.0.1:0", "max_length": 64}', "--subset-size", "32", "--batch-size", "8",
              "--generation", '{"prompts": 0}', "--config", str(config), *factories]
    last = steps[-1]
    losses, responses, served, reasons = {}, {}, {}, {}
    for degree in degrees:
        devices = ",".join(str(d) for d in range(degree))
        args = ["--device", devices, "--logdir", str(tmp_path / f"tp{degree}"), *common]
        if degree > 1:
            args += ["--tensor-parallel", str(degree), "--group", json.dumps({"log_dir": str(tmp_path / f"ms{degree}")})]
        evald = faults.start(tmp_path, None, *args, name=f"tp{degree}", fast=False,
                             env={"HF_DATASETS_CACHE": str(tmp_path / "hf")})
        procs.append(evald)
        run = run_dir(ckpt, tmp_path / f"tp{degree}")
        wait_for(lambda: len(list((run / "samples").rglob("*.jsonl.gz"))) == 2 * len(steps)
                 or evald.popen.poll() is not None, GROUP_TIMEOUT_S, "the suite's cells", interval=0.5)
        wait_for(lambda: {r["step"] for r in faults.ledger_rows(ckpt, tmp_path / f"tp{degree}")
                          if r["state"] in ("evaluated", "failed")} >= set(refused) or evald.popen.poll() is not None,
                 GROUP_TIMEOUT_S, "the refused steps", interval=0.5)
        assert evald.popen.poll() is None, evald.output()[-4000:]
        served[degree] = _completion(json.loads((run / "serve.json").read_text())["url"], run.name, last)
        evald.signal(signal.SIGTERM)
        assert evald.wait(GROUP_TIMEOUT_S) == 0, evald.output()[-4000:]
        rows = faults.ledger_rows(ckpt, tmp_path / f"tp{degree}")
        assert [(r["step"], r["state"]) for r in rows] == sorted([(s, "evaluated") for s in steps]
                                                                 + [(s, "failed") for s in refused]), rows
        for row in rows:
            if row["step"] in refused:   # one device's reason, whichever rank of the group found the bad file
                assert refused[row["step"]] in row["reason"] and row["attempts"] == 1, row
                reasons.setdefault(row["step"], set()).add(row["reason"])
        losses[degree] = {s: v for s, _, v in scalar_points(run, "eval/loss")}
        responses[degree] = _responses(run)
        if degree > 1:
            assert f"tensor-parallel eval group of {degree} ranks ready" in evald.output()
            worker = (tmp_path / f"ms{degree}" / "worker_1.log").read_text(errors="replace")
            assert f"rank 1 of {degree}: read" in worker   # its slices only (counted in its log line)
    one = degrees[0]
    assert all(len(texts) == 1 for texts in reasons.values()), reasons   # the same reason at every degree
    assert sorted(losses[one]) == steps
    for degree in degrees[1:]:
        assert losses[degree].keys() == losses[one].keys() and all(
            math.isclose(losses[degree][s], losses[one][s], rel_tol=1e-6) for s in steps), losses
    assert len(responses[one]) == 2 * len(steps) and all(responses[d].keys() == responses[one].keys()
                                                        for d in degrees), responses
    for name, values in responses[one].items():
        ones, flags = _numbers(values)
        assert len(ones) >= 2 and all(math.isfinite(v) for v in ones), name   # 2 bpb documents, 12 questions
        for degree in degrees[1:]:
            theirs, their_flags = _numbers(responses[degree][name])
            assert their_flags == flags, (degree, name)
            assert np.allclose(theirs, ones, rtol=1e-6, atol=0), (degree, name, np.max(np.abs(
                np.asarray(theirs) / np.asarray(ones) - 1)))
    for degree in degrees[1:]:
        assert served[degree]["text"] == served[one]["text"] and served[degree]["tokens"] == served[one]["tokens"]
        assert np.allclose(served[degree]["logprobs"], served[one]["logprobs"], rtol=1e-6, atol=0), (degree, served)
    run = run_dir(ckpt, tmp_path / f"tp{one}")
    indices = json.loads((run / "subset.json").read_text())["indices"]
    reference = in_process_loss(weights, indices)
    assert losses[one][last] == pytest.approx(reference, rel=1e-5), (losses, reference)
    # the last step's multiple-choice log-likelihoods against one device's network in this process, by hand
    net = _in_process_network(weights)
    docs = [json.loads(line) for line in (Path(include) / "data" / "stdlib_next_line.jsonl").read_text().splitlines()]
    [mc_file] = [name for name in responses[one] if "stdlib_next_line" in name and f"step_{last}." in name]
    lines = gzip.decompress((run / mc_file).read_bytes()).decode().splitlines()
    for sample in sorted((json.loads(line) for line in lines), key=lambda d: d["doc_id"])[:4]:
        doc = docs[sample["doc_id"]]
        for choice, resp in zip(doc["choices"], sample["resps"]):
            ll = _numbers(resp)[0][0]
            want = in_process_loglikelihood(net, doc["context"], choice)
            assert ll == pytest.approx(want, rel=1e-5), (sample["doc_id"], choice, ll, want)
    # the served completion: the prompt's values and the greedy tokens' of one device's network in process
    prompt = list(PROMPT.encode())
    generated = len(served[one]["logprobs"]) - (len(prompt) - 1)
    assert generated >= 1, served[one]
    assert np.allclose(served[one]["logprobs"], in_process_greedy(net, prompt, generated), rtol=1e-5, atol=0), served


def test_one_two_and_four_tensor_parallel_ranks_give_the_loss_and_the_suite_of_one_device(tmp_path, procs):
    """... and refuse, as one device does, a snapshot with one byte changed (step 5: in the last part's data,
    which at TP 2 and 4 only one rank verifies and at TP 4 another rank reads slices of)."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    weights = _whole_weights()
    _write_tp_parts(ckpt, 10, weights, 4)
    _write_tp_parts(ckpt, 5, weights, 4)
    changed = ckpt / part_dir_name(5, 3, 4) / layout.WEIGHTS_FILE
    with open(changed, "r+b") as f:
        f.seek(-5, 2)
        last = f.read(1)[0]
        f.seek(-5, 2)
        f.write(bytes([last ^ 0x04]))
    evaluate_at_degrees(tmp_path, procs, ckpt, [10], weights,
                        refused={5: f"{changed}: xxh3-128"})
