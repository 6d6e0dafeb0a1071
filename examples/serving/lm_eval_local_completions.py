"""Score the demo's benchmarks with lm-eval's `local-completions` model against `evald --serve`.

    python -m examples.serving.lm_eval_local_completions http://127.0.0.1:8000 demo@400 TASK_DIR

Writes the demo's tasks (examples.tiny_lm.benchmarks) in TASK_DIR, waits until evald's /health is ok, checks
that evald serves the model asked for (GET /v1/models; else it stops at once, naming those it serves: lm-eval
would tokenize every request before its first one got the 404), and runs a multiple-choice task
(stdlib_next_line: acc, acc_norm) and a rolling one (bpb_email: bits_per_byte) offline: lm-eval tokenizes through evald's /tokenize (tokenizer_backend=remote), so no tokenizer is
downloaded, and every request names the step it wants (model=RUN@STEP). Two settings make lm-eval score
exactly as the in-process suite does, both read from /tokenizer_info: max_length = the window + 2 (lm-eval
keeps one token for generation and rolls windows of max_length - 2 inputs) and custom_prefix_token_id =
the suite's prefix token (lm-eval's convention: BOS, else EOS). Prints the results and each request's
log-likelihood as JSON.
"""

import json
import os
import sys
import time
import urllib.request
from pathlib import Path

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from examples.tiny_lm.benchmarks import write_benchmarks

url, model, task_dir = sys.argv[1], sys.argv[2], Path(sys.argv[3])
TASKS, LIMIT = ["stdlib_next_line", "bpb_email"], 16


def wait_until_ready(timeout_s: float = 600) -> dict:
    """evald's /health is ok once a step is servable; then /tokenizer_info says the window."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=10) as answer:
                if json.load(answer)["ok"]:
                    break
        except OSError:
            pass   # not listening yet, or 503 while the network is built
        if time.monotonic() > deadline:
            raise SystemExit(f"{url}/health was not ok within {timeout_s:.0f}s")
        time.sleep(1)
    with urllib.request.urlopen(f"{url}/tokenizer_info", timeout=10) as answer:
        return json.load(answer)["evald"]


def check_served(model: str) -> None:
    with urllib.request.urlopen(f"{url}/v1/models", timeout=10) as answer:
        served = [entry["id"] for entry in json.load(answer)["data"]]
    if model not in served:
        raise SystemExit(f"{model} is not served at {url}: it serves {', '.join(served)} (GET {url}/v1/models)")


info = wait_until_ready()
check_served(model)
import lm_eval  # noqa: E402 - after the checks: importing it takes seconds
from lm_eval.tasks import TaskManager  # noqa: E402

prefix = info["bos_id"] if info["bos_id"] is not None else info["eos_id"]
write_benchmarks(task_dir, next_line_count=LIMIT, bpb_docs_per_set=2)
results = lm_eval.simple_evaluate(
    model="local-completions",
    model_args=(f"base_url={url}/v1/completions,model={model},tokenizer_backend=remote,"
                f"max_length={info['lm_eval_max_length']},custom_prefix_token_id={prefix}"),
    tasks=TASKS, task_manager=TaskManager(include_path=str(task_dir)), log_samples=True, batch_size=4)
print(json.dumps({task: {"results": results["results"][task],
                         "loglikelihoods": [[r[0][0] if isinstance(r[0], (list, tuple)) else r[0] for r in s["resps"]]
                                            for s in results["samples"][task]]} for task in TASKS}))
