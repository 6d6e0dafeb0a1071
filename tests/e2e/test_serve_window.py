"""evald --serve on a network that has no max_length-like attribute (issue 26 item 4, issue 27 item 4): with
serve.max_length it serves; without, one ERROR says what to set, /health says it (503), and every checkpoint
is still evaluated; no crash either way. When evald stops, serve.json goes and `evald status` says serving
stopped (not a dead URL)."""

from __future__ import annotations

import json
import signal
import subprocess

import pytest

httpx = pytest.importorskip("httpx")

from tests.harness import PYTHON, REPO, base_env, run_dir, scalar_points, start_evald, wait_for  # noqa: E402

FACTORIES = ["--model-factory", "tests.windowless_factory:build_model", "--model-kwargs", '{"seq_len": 64}',
             "--data-factory", "examples.tiny_lm.data:validation_windows", "--data-kwargs", '{"seq_len": 64}',
             "--app-dir", str(REPO)]


@pytest.mark.parametrize("serve, served", [({"max_length": 64}, True), ({}, False)],
                         ids=["with-serve-max-length", "without"])
def test_a_network_without_a_window(tmp_path, endpoints, procs, finished_training, serve, served):
    ckpt = finished_training.ckpt   # steps 10 to 40
    options = json.dumps({"listen": "127.0.0.1:0", **serve})
    evald = start_evald(tmp_path, endpoints, ["--ckpt-dir", str(ckpt), "--lag-policy", "all", "--endpoint", "none",
                                              "--serve", options, "--serve-forever", *FACTORIES])
    procs.append(evald)
    wait_for(lambda: [s for s, _, _ in scalar_points(run_dir(ckpt), "eval/loss")] == [10, 20, 30, 40], 400,
             "every checkpoint evaluated")
    url = json.loads((run_dir(ckpt) / "serve.json").read_text())["url"]
    run = run_dir(ckpt).name
    with httpx.Client(base_url=url, timeout=120) as client:
        # ready (with a window) or off for good (without): not the transient "graphs still compiling"
        health = wait_for(lambda: (lambda h: h if h.json()["ok"] == served or "serve.max_length" in h.json().get(
            "error", "") else None)(client.get("/health")), 300, "/health")
        answer = client.post("/v1/completions", json={"model": f"{run}@20", "prompt": "import os", "max_tokens": 0,
                                                      "echo": True, "logprobs": 1})
    if served:
        assert health.status_code == 200 and health.json()["ok"], health.text
        assert answer.status_code == 200 and answer.json()["evald"]["step"] == 20, answer.text
    else:
        assert health.status_code == 503 and "serve.max_length" in health.json()["error"], health.text
        assert answer.status_code == 503 and "serve.max_length" in answer.json()["error"]["message"]
        errors = [line for line in evald.output().splitlines() if " ERROR " in line]
        assert len(errors) == 1 and "serving is off" in errors[0], errors
    evald.signal(signal.SIGTERM)
    assert evald.wait(120) == 0, evald.output()[-3000:]
    assert "Traceback" not in evald.output()
    assert not (run_dir(ckpt) / "serve.json").exists()
    status = subprocess.run([PYTHON, "-m", "evald", "status", "--ckpt-dir", str(ckpt)], env=base_env(), cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert "serving      stopped" in status.stdout, status.stdout
