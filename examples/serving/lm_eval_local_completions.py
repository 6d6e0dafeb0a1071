"""Score a local log-likelihood task with lm-eval's `local-completions` model against `evald --serve`.

    python -m examples.serving.lm_eval_local_completions http://127.0.0.1:8000 demo@20 TASK_DIR

Writes a small multiple-choice task (which of four lines follows a line of heapq.py) with its data in
TASK_DIR, then runs it offline: lm-eval tokenizes through evald's /tokenize (tokenizer_backend=remote),
so no tokenizer is downloaded, and every request names the step it wants (model=RUN@STEP).
Prints the results and each request's log-likelihood as JSON.
"""

import json
import os
import random
import sys
import sysconfig
from pathlib import Path

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import lm_eval
from lm_eval.tasks import TaskManager

url, model, task_dir = sys.argv[1], sys.argv[2], Path(sys.argv[3])


def write_task(directory: Path, count: int = 20) -> None:
    lines = [ln.rstrip() for ln in Path(sysconfig.get_paths()["stdlib"], "heapq.py").read_text().splitlines()
             if len(ln.strip()) >= 12]
    rng = random.Random(0)
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "docs.jsonl", "w") as f:
        for i in range(0, 10 * count, 10):
            following = lines[i + 1].strip()[:24]
            choices = [lines[rng.randrange(len(lines))].strip()[:24] for _ in range(3)] + [following]
            rng.shuffle(choices)
            f.write(json.dumps({"context": lines[i][-36:], "choices": choices, "gold": choices.index(following)}) + "\n")
    (directory / "next_line.yaml").write_text(
        "task: next_line\ndataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {directory.resolve() / 'docs.jsonl'}\n"
        "test_split: test\noutput_type: multiple_choice\ndoc_to_text: \"{{context}}\"\n"
        "doc_to_choice: \"{{choices}}\"\ndoc_to_target: gold\n"
        "metric_list:\n  - metric: acc\n  - metric: acc_norm\n")


write_task(task_dir)
results = lm_eval.simple_evaluate(
    model="local-completions",
    # max_length: the model's window (64 for the demo) + 1, the token lm-eval keeps for generation
    model_args=f"base_url={url}/v1/completions,model={model},tokenizer_backend=remote,max_length=65",
    tasks=["next_line"], task_manager=TaskManager(include_path=str(task_dir)), log_samples=True)
print(json.dumps({"results": results["results"]["next_line"],
                  "loglikelihoods": [[r[0][0] for r in sample["resps"]] for sample in results["samples"]["next_line"]]}))
