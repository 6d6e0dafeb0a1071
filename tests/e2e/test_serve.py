"""evald --serve as a real process on loopback: lm-eval's local-completions and the openai client against it,
A/B/A bit-identical, answers recomputed from the snapshot they name, hostile clients refused while
every checkpoint is still evaluated (docs/serving.md)."""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest

httpx = pytest.importorskip("httpx")

from tests.harness import (PYTHON, REPO, base_env, committed_steps, run_dir, scalar_points, start_evald,  # noqa: E402
                           start_trainer, wait_for)


def _client_env() -> dict[str, str]:
    """The test's environment for client processes: the repository first, then whatever this run added."""
    env = base_env({"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"})
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return env


def _serving(ckpt: Path, steps: list[int], timeout: float = 240) -> tuple[str, str]:
    """(url, run name) once evald serves and lists ``steps`` as servable."""
    info = wait_for(lambda: (run_dir(ckpt) / "serve.json").exists() and json.loads(
        (run_dir(ckpt) / "serve.json").read_text()), timeout, "serve.json")
    run = info["model"].split("@")[0]

    def listed():
        try:
            ids = [m["id"] for m in httpx.get(f"{info['url']}/v1/models", timeout=10).json()["data"]]
        except httpx.HTTPError:
            return False
        return all(f"{run}@{s}" in ids for s in steps)

    wait_for(listed, timeout, f"steps {steps} in /v1/models")

    def ready():   # the serving graphs compiled (one per loop turn), as docs/serving.md says to wait for
        try:
            return httpx.get(f"{info['url']}/health", timeout=10).json()["ok"]
        except httpx.HTTPError:
            return False

    wait_for(ready, timeout, "/health ok")
    return info["url"], run


def _provenance(ckpt: Path, step: int) -> str:
    from evald.cli.status import ReadOnlyLedger

    ledger = ReadOnlyLedger(run_dir(ckpt) / "ledger.sqlite")
    try:
        return ledger.provenance(step)["weights_sha256"]
    finally:
        ledger.close()


def _flat(rows: list[list[float]]) -> list[float]:
    return [value for row in rows for value in row]


def _echo(client, model: str, prompt: str) -> httpx.Response:
    return client.post("/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": 0, "echo": True,
                                                "logprobs": 1, "temperature": 0})


@pytest.mark.smoke
def test_lm_eval_and_the_openai_client_against_evald_serve(tmp_path, endpoints, procs, finished_training):
    ckpt = finished_training.ckpt  # a real training run's checkpoints 10 to 40 (tests/e2e/conftest.py)
    evald = start_evald(tmp_path, endpoints, ["--ckpt-dir", str(ckpt), "--lag-policy", "all", "--endpoint", "none",
                                              "--serve", "127.0.0.1:0", "--serve-forever"])
    procs.append(evald)
    url, run = _serving(ckpt, [10, 20, 30, 40])

    # A/B/A: step 10, then 30, then 10 again; each answer names the digest its evaluation recorded.
    prompts = ["import os\nimport sys\n", "def main(argv):\n    return 0", "x = {'a': [1, 2.5]}"]
    with httpx.Client(base_url=url, timeout=120) as client:
        answers = [[_echo(client, f"{run}@{step}", p) for p in prompts] for step in (10, 30, 10)]
    for step, batch in zip((10, 30, 10), answers):
        for response in batch:
            assert response.status_code == 200, response.text
            assert response.headers["x-evald-step"] == str(step) and response.json()["model"] == f"{run}@{step}"
            assert response.headers["x-evald-snapshot"] == response.json()["evald"]["snapshot"] == _provenance(ckpt,
                                                                                                              step)
    values = [[r.json()["choices"][0]["logprobs"]["token_logprobs"] for r in batch] for batch in answers]
    assert values[0] == values[2] and values[0] != values[1]

    # The openai client, as docs/serving.md shows it.
    shown = subprocess.run([PYTHON, "-m", "examples.serving.openai_client", f"{url}/v1", f"{run}@latest"],
                           env=_client_env(), cwd=REPO, capture_output=True, text=True, timeout=300)
    assert shown.returncode == 0, shown.stderr[-3000:]
    example = json.loads(shown.stdout.strip().splitlines()[-1])
    assert example["model"] == f"{run}@40" and example["evald"]["snapshot"] == _provenance(ckpt, 40)
    assert example["header_step"] == "40" and example["token_logprobs"][0] is None

    # lm-eval's local-completions on step 20, as docs/serving.md shows it ...
    task_dir = tmp_path / "task"
    scored = subprocess.run([PYTHON, "-m", "examples.serving.lm_eval_local_completions", url, f"{run}@20",
                             str(task_dir)], env=_client_env(), cwd=tmp_path, capture_output=True, text=True,
                            timeout=600)
    assert scored.returncode == 0, scored.stderr[-3000:]
    served = json.loads(scored.stdout.strip().splitlines()[-1])

    # ... equals the same tasks in process, on the same step: multiple choice and bits_per_byte (rolling).
    import lm_eval
    from lm_eval.tasks import TaskManager

    import mindspore as ms

    from evald.pipeline.suites.lm_adapter import EvaldLM
    from evald.pipeline.suites.scoring import TokenScorer
    from evald.pipeline.suites.tokenizer import ByteTokenizer
    from tests.e2e.reference import network_at

    net = network_at(ckpt, 20)
    ms.set_context(mode=ms.GRAPH_MODE)
    lm = EvaldLM(TokenScorer(net, batch_size=8), ByteTokenizer())   # the suite's scorer and defaults
    local = lm_eval.simple_evaluate(model=lm, tasks=list(served), limit=16, log_samples=True,
                                    task_manager=TaskManager(include_path=str(task_dir)))
    for task, http in served.items():
        mine = local["results"][task]
        for metric in ("acc,none", "acc_norm,none", "bits_per_byte,none"):
            if metric in mine:
                assert http["results"][metric] == pytest.approx(mine[metric], rel=1e-6), (task, metric)
        expected = [[r[0][0] if isinstance(r[0], (list, tuple)) else r[0] for r in sample["resps"]]
                    for sample in local["samples"][task]]
        assert _flat(http["loglikelihoods"]) == pytest.approx(_flat(expected), rel=1e-6), task
    assert "bits_per_byte,none" in served["bpb_email"]["results"]

    status = subprocess.run([PYTHON, "-m", "evald", "status", "--ckpt-dir", str(ckpt)], env=_client_env(),
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    evald.signal(signal.SIGTERM)
    assert evald.wait(120) == 0, evald.output()[-3000:]
    assert scalar_points(run_dir(ckpt), "serve/served")[-1][2] >= 9 + 3 + 16   # the requests above, at least
    assert "serving" in status.stdout, status.stdout


def test_hostile_and_steady_clients_while_training_every_checkpoint_is_evaluated(tmp_path, endpoints, procs):
    ckpt = tmp_path / "ckpt"
    evald = start_evald(tmp_path, endpoints, ["--lag-policy", "all", "--serve-forever", "--serve",
                                              '{"listen": "127.0.0.1:0", "max_body_bytes": 65536, '
                                              '"header_timeout_s": 2, "report_every_s": 1}'])
    procs.append(evald)
    trainer = start_trainer(tmp_path, ckpt, endpoints, steps=60, every=5, loop="custom",
                            extra=["--step-sleep", "0.05"])
    procs.append(trainer)
    url, run = _serving(ckpt, [5])
    stop = threading.Event()
    answers: list[tuple[str, dict]] = []
    refused: list[int] = []

    def steady(seed: int) -> None:
        rng = np.random.default_rng(seed)
        with httpx.Client(base_url=url, timeout=120) as client:
            while not stop.is_set():
                listed = client.get("/v1/models")
                if listed.status_code != 200:   # 503 from uvicorn while the crowd below is over limit_concurrency
                    stop.wait(0.2)
                    continue
                ids = [m["id"] for m in listed.json()["data"]]
                model = str(rng.choice(ids))
                prompt = "".join(rng.choice(list("abcdef (){}:=\n"), int(rng.integers(3, 50))))
                response = _echo(client, model, prompt)
                if response.status_code == 200:
                    answers.append((prompt, response.json()))

    def hostile() -> None:
        bodies = [b"{not json", b'{"prompt": "a", "temperature": NaN}', b'{"prompt": "a", "max_tokens": -1}',
                  json.dumps({"prompt": "x" * 60000}).encode(), b"x" * 100000, b'{"prompt": [[1, 99999]]}']
        with httpx.Client(base_url=url, timeout=60) as client:
            while not stop.is_set():
                for body in bodies:
                    refused.append(client.post("/v1/completions", content=body).status_code)
                slow = [socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1]))) for _ in range(20)]
                for s in slow:
                    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")   # never finished
                crowd = [socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1]))) for _ in range(300)]
                stop.wait(0.5)
                for s in slow + crowd:
                    s.close()
                stop.wait(1.5)

    threads = [threading.Thread(target=steady, args=(i,), daemon=True) for i in range(2)]
    threads.append(threading.Thread(target=hostile, daemon=True))
    for t in threads:
        t.start()
    try:
        assert trainer.wait(600) == 0, trainer.output()[-3000:]
        committed = committed_steps(ckpt)
        wait_for(lambda: [s for s, _, _ in scalar_points(run_dir(ckpt), "eval/loss")] == committed, 300,
                 "every checkpoint evaluated while clients keep coming")
        # the steady clients are answered, hostile ones still coming (serving compiles its graphs one a turn,
        # beside the evaluations: on a loaded machine a short training may end before 20 answers)
        wait_for(lambda: len(answers) >= 20, 300, "20 answers to the steady clients")
    finally:
        stop.set()
        for t in threads:
            t.join(120)
    evald.signal(signal.SIGTERM)
    assert evald.wait(120) == 0, evald.output()[-3000:]
    assert committed == list(range(5, 61, 5))
    assert refused and set(refused) <= {400, 413}, sorted(set(refused))
    assert len(answers) >= 20
    steps = {a["evald"]["step"] for _, a in answers}
    assert len(steps) >= 4, steps
    swaps = scalar_points(run_dir(ckpt), "serve/swaps")[-1][2]
    assert swaps >= 5, swaps   # pinned steps the network did not hold were swapped in between evaluations

    # A sample of answers, recomputed from the snapshot each one names: the same log-probabilities.
    from tests.e2e.reference import logprobs, network_at

    rng = np.random.default_rng(0)
    sample = [answers[i] for i in rng.choice(len(answers), min(40, len(answers)), replace=False)]
    for step in sorted({a["evald"]["step"] for _, a in sample}):
        net = network_at(ckpt, step)
        digest = _provenance(ckpt, step)
        for prompt, answer in (x for x in sample if x[1]["evald"]["step"] == step):
            assert answer["evald"]["snapshot"] == digest
            served = answer["choices"][0]["logprobs"]["token_logprobs"][1:]
            expected = logprobs(net, list(prompt.encode()))
            np.testing.assert_allclose(served, expected, rtol=0, atol=5e-5, err_msg=f"step {step}: {prompt!r}")
            assert all(math.isfinite(v) for v in served)
