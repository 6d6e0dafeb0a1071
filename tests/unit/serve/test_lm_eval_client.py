"""lm-eval's own `local-completions` client against the served network gives the in-process suite's numbers:
multiple choice and bits_per_byte (rolling windows), with the settings docs/serving.md gives (issue 26
item 4). The server is the real app and scorer in this process (tests/unit/serve/rig.py); the client is the
page's example, a separate process; the CLI form of the page's command runs too (`--batch_size`, never
inside model_args)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ms = pytest.importorskip("mindspore")
pytest.importorskip("lm_eval")
pytest.importorskip("tenacity")

from evald.config import ServeOptions  # noqa: E402
from evald.pipeline.suites.lm_adapter import EvaldLM  # noqa: E402
from evald.pipeline.suites.scoring import TokenScorer  # noqa: E402
from evald.pipeline.suites.tokenizer import ByteTokenizer  # noqa: E402
from tests.networks import demo_network_in_graph_mode  # noqa: E402
from tests.unit.serve.rig import Loop, Rig, snapshot  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
DOC = (REPO / "docs" / "serving.md").read_text()


def _env() -> dict[str, str]:
    env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", GLOG_v="3")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


def _example(url: str, model: str, task_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "examples.serving.lm_eval_local_completions", url, model,
                           str(task_dir)], env=_env(), cwd=REPO, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(rig, the example's output, its task directory, the page's CLI, the example asked for a step not served
    with the rig's request counts before and after): lm-eval's client scored step 10 over HTTP."""
    with demo_network_in_graph_mode(seed=8) as net:
        rig = Rig(net, ServeOptions(listen="127.0.0.1:0", batch_size=4), {10: snapshot(net, 1)})
        task_dir = tmp_path_factory.mktemp("tasks")
        try:
            rig.drop()
            with Loop(rig):   # nothing in the network yet: /health is ok (step 10 is servable), 10 swaps in
                before = dict(rig.stats.counts)
                unknown = _example(rig.url, "unit@20", tmp_path_factory.mktemp("unknown"))
                refused = (unknown, before, dict(rig.stats.counts))
                done = _example(rig.url, "unit@10", task_dir)
                assert done.returncode == 0, done.stderr[-4000:]
                cli = _cli(rig.url, task_dir)
            yield rig, json.loads(done.stdout.strip().splitlines()[-1]), task_dir, cli, refused
        finally:
            rig.close()


def _flat(rows: list[list[float]]) -> list[float]:
    return [value for row in rows for value in row]


def _cli(url: str, task_dir: Path) -> subprocess.CompletedProcess:
    """The page's lm_eval command, its placeholders filled in, with a small --limit."""
    [command] = [line for block in re.findall(r"```bash\n(.*?)```", DOC, re.S)
                 for line in block.replace("\\\n", " ").splitlines() if line.startswith("lm_eval ")]
    argv = shlex.split(command.replace("TASK_DIR", str(task_dir)).replace("http://127.0.0.1:8000", url))
    argv = [re.sub(r"model=demo@\w+", "model=unit@10", a) for a in argv]
    lm_eval = str(Path(sys.executable).parent / "lm_eval")
    return subprocess.run([lm_eval, *argv[1:], "--limit", "4"], env=_env(), cwd=REPO, capture_output=True,
                          text=True, timeout=900)


def test_multiple_choice_and_bits_per_byte_equal_the_in_process_suite(served):
    import lm_eval
    from lm_eval.tasks import TaskManager

    rig, shown, task_dir = served[:3]
    rig.swap(10)
    lm = EvaldLM(TokenScorer(rig.network, batch_size=8), ByteTokenizer())   # the suite's scorer and defaults
    local = lm_eval.simple_evaluate(model=lm, tasks=list(shown), limit=16, log_samples=True,
                                    task_manager=TaskManager(include_path=str(task_dir)))
    for task, http in shown.items():
        mine = local["results"][task]
        for metric in ("acc,none", "acc_norm,none", "bits_per_byte,none", "byte_perplexity,none"):
            if metric in mine:
                assert http["results"][metric] == pytest.approx(mine[metric], rel=1e-6), (task, metric)
        expected = [[r[0][0] if isinstance(r[0], (list, tuple)) else r[0] for r in s["resps"]]
                    for s in local["samples"][task]]
        assert _flat(http["loglikelihoods"]) == pytest.approx(_flat(expected), rel=1e-6), task
    assert "bits_per_byte,none" in shown["bpb_email"]["results"] and "acc,none" in shown["stdlib_next_line"]["results"]


def test_the_pages_lm_eval_command_runs_with_its_batch_size(served):
    cli = served[3]
    assert cli.returncode == 0, cli.stderr[-4000:]
    assert "stdlib_next_line" in cli.stdout and "bpb_email" in cli.stdout, cli.stdout[-2000:]


def test_the_page_never_puts_batch_size_inside_model_args():
    for args in re.findall(r"model_args[ =]\S+", DOC):
        assert "batch_size" not in args, args
    assert "`batch_size` model argument" not in DOC


def test_the_example_refuses_a_step_that_is_not_served_before_lm_eval_sends_anything(served):
    """Issue 37 item 2: asked for a step evald does not serve, the example ran lm-eval, which tokenized every
    request through /tokenize (100 s on a loaded machine) before its first completion got a 404, retried
    three times. It now asks GET /v1/models first and stops, naming the models evald serves."""
    unknown, before, after = served[4]
    assert unknown.returncode != 0
    said = unknown.stderr.strip().splitlines()[-1]
    assert said.startswith(f"unit@20 is not served at {served[0].url}: it serves unit@latest, unit@10"), said
    assert "Traceback" not in unknown.stderr and unknown.stdout == ""
    assert (before.get("served", 0), before.get("refused", 0)) == (after.get("served", 0), after.get("refused", 0))
