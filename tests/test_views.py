"""What a TensorBoard user sees (issue 11): a real short run with evald beside it, then TensorBoard
itself on the log directory, asked through its HTTP data API and looked at in headless Chromium.

The browser is Debian's chromium-headless-shell (or chromium); scripts/setup_env.sh installs it
when it runs as root. Without it this test fails, it never skips: the view is what it checks.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.harness import PYTHON, Proc, base_env, committed_steps, start_evald, start_trainer, wait_for

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run")


def browser() -> str:
    for name in ("chromium-headless-shell", "chromium"):
        found = shutil.which(name)
        if found:
            return found
    pytest.fail("no headless Chromium: install it with `apt-get install -y chromium-headless-shell` (or "
                "`chromium`); scripts/setup_env.sh --with-browser does this when run as root")


def get(base: str, path: str, **query: str):
    url = f"{base}{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


def test_tensorboard_overlays_train_and_eval_loss_of_each_run(tmp_path, endpoints, procs):
    chromium = browser()
    ckpt = tmp_path / "demo" / "ckpt"  # the demo's layout: runs/demo/ckpt
    evald = start_evald(tmp_path, endpoints, ["--lag-policy", "all"])
    procs.append(evald)
    trainer = start_trainer(tmp_path, ckpt, endpoints, steps=60, every=20)
    procs.append(trainer)
    assert trainer.wait(300) == 0, trainer.output()[-3000:]
    assert evald.wait(300) == 0, evald.output()[-3000:]

    logdir = tmp_path / "demo" / "tensorboard"  # the default: beside the checkpoint directory
    assert sorted(p.name for p in logdir.iterdir()) == ["demo"]
    assert "evald" not in {p.name for p in ckpt.iterdir()}  # nothing of evald's in the trainer's directory
    tensorboard = Proc([PYTHON, "-m", "tensorboard.main", "--logdir", str(logdir), "--host", "127.0.0.1",
                        "--port", "0", "--load_fast=false"], base_env(), tmp_path / "tensorboard.log")
    procs.append(tensorboard)
    found = wait_for(lambda: re.search(r"at (http://127\.0\.0\.1:\d+)/", tensorboard.output()), 120,
                     "TensorBoard's address")
    base = found.group(1)

    runs = wait_for(lambda: sorted(get(base, "/data/runs")) or None, 60, "TensorBoard's runs")
    assert runs == ["demo/eval", "demo/train"]  # one run per training run, no "."
    tags = get(base, "/data/plugin/scalars/tags")
    assert "loss" in tags["demo/train"] and "loss" in tags["demo/eval"]  # the same tag: one chart
    train = get(base, "/data/plugin/scalars/scalars", run="demo/train", tag="loss")
    evaluated = get(base, "/data/plugin/scalars/scalars", run="demo/eval", tag="loss")
    assert [step for _, step, _ in evaluated] == committed_steps(ckpt) == [20, 40, 60]
    assert len(train) >= 30 and all(v > 0 for _, _, v in train + evaluated)
    assert {t for t in tags["demo/eval"] if t.startswith("evald/")} >= {"evald/load_s", "evald/evaluate_s"}
    [summary] = get(base, "/data/plugin/text/text", run="demo/eval", tag="evald/summary/text_summary")
    assert "<th>field</th>" in summary["text"] and "<strong>best step</strong>" in summary["text"]
    assert "{" not in summary["text"]  # a table, not raw JSON

    shot = tmp_path / "tensorboard.png"
    result = subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chromium-profile'}",
                             "--window-size=1400,1000", "--virtual-time-budget=20000", f"--screenshot={shot}",
                             f"{base}/?forceSVG=true&tagFilter=%5Eloss%24#timeseries"], capture_output=True, text=True, timeout=180)
    assert result.returncode == 0 and shot.exists(), result.stderr[-3000:]
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000, len(png)  # a rendered page, not a blank one
    print(f"screenshot: {shot}")
