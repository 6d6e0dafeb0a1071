"""What a TensorBoard user sees (issues 11 and 18): a real short run with evald beside it, then TensorBoard
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

from tests import faults
from tests.harness import PYTHON, Proc, base_env, committed_steps, wait_for

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run")


def browser() -> str:
    for name in ("chromium-headless-shell", "chromium"):
        found = shutil.which(name)
        if found:
            return found
    pytest.fail("no headless Chromium: install it with `apt-get install -y chromium-headless-shell` (or "
                "`chromium`); scripts/setup_env.sh --with-system-tools (run by ./scripts/test.sh --rest) does this as root")


def get(base: str, path: str, **query: str):
    url = f"{base}{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


def test_tensorboard_overlays_train_and_eval_loss_of_each_run(tmp_path, procs, side_by_side_run):
    chromium = browser()
    # The session's demo run (tests/e2e/conftest.py): evald beside a Model.train run of 60 steps, a checkpoint
    # every 20, in the demo's layout runs/demo/ckpt. This test adds a run to the log directory: a copy.
    run = side_by_side_run
    assert run.trainer_code == 0, run.trainer_output[-3000:]
    assert run.evald_code == 0, run.evald_output[-3000:]
    assert "evald" not in {p.name for p in run.ckpt.iterdir()}  # nothing of evald's in the trainer's directory
    shutil.copytree(run.ckpt.parent, tmp_path / "demo", symlinks=True)
    ckpt = tmp_path / "demo" / "ckpt"

    logdir = tmp_path / "demo" / "tensorboard"  # the default: beside the checkpoint directory
    assert sorted(p.name for p in logdir.iterdir()) == ["demo"]
    # A second run shares the log directory (evaluations only: no trainer, a checkpoint on disk).
    other = tmp_path / "lr-3e-4" / "ckpt"
    faults.announce(other)
    faults.commit(other, 10)
    second = faults.start(tmp_path, other, "--logdir", str(logdir), "--idle-exit-s", "2", name="evald-second")
    procs.append(second)
    assert second.wait(240) == 0, second.output()[-3000:]
    tensorboard = Proc([PYTHON, "-m", "tensorboard.main", "--logdir", str(logdir), "--host", "127.0.0.1",
                        "--port", "0", "--load_fast=false"], base_env(), tmp_path / "tensorboard.log")
    procs.append(tensorboard)
    found = wait_for(lambda: re.search(r"at (http://127\.0\.0\.1:\d+)/", tensorboard.output()), 120,
                     "TensorBoard's address")
    base = found.group(1)

    runs = wait_for(lambda: sorted(get(base, "/data/runs")) or None, 60, "TensorBoard's runs")
    assert runs == ["demo/eval", "demo/train", "lr-3e-4/eval"]  # readable names side by side, no "."
    tags = get(base, "/data/plugin/scalars/tags")
    assert "Loss" in tags["demo/train"] and "Loss" in tags["demo/eval"]  # the same tag: one chart
    assert [step for _, step, _ in get(base, "/data/plugin/scalars/scalars", run="lr-3e-4/eval", tag="Loss")] == [10]
    train = get(base, "/data/plugin/scalars/scalars", run="demo/train", tag="Loss")
    evaluated = get(base, "/data/plugin/scalars/scalars", run="demo/eval", tag="Loss")
    assert [step for _, step, _ in evaluated] == committed_steps(ckpt) == [20, 40, 60]
    assert len(train) >= 30 and all(v > 0 for _, _, v in train + evaluated)
    assert {t for t in tags["demo/eval"] if t.startswith("evald/")} >= {"evald/load_s", "evald/evaluate_s"}
    [summary] = get(base, "/data/plugin/text/text", run="demo/eval", tag="evald/summary/text_summary")
    assert "<th>field</th>" in summary["text"] and "<strong>best step</strong>" in summary["text"]
    assert "{" not in summary["text"]  # a table, not raw JSON

    # The page itself: the loss card draws a line per run (SVG: forceSVG), and the screenshot shows them.
    page = f"{base}/?forceSVG=true#timeseries"  # the first screen as it opens: Loss is the first card
    shot = tmp_path / "tensorboard.png"
    # Headless Chromium captures the page when its virtual time runs out, which can be before the
    # chart has fetched its data from TensorBoard (slow until TensorBoard has loaded it once, and
    # on a loaded machine): each attempt is a fresh browser; one complete drawing is what counts.
    for attempt in range(10):
        dom = chromium_run(chromium, tmp_path, "--dump-dom", page, profile=f"dom-{attempt}").stdout
        strokes = set(re.findall(r'<path d="M[^"]*"[^>]*?stroke: (rgb\(\d+, \d+, \d+\)); opacity: 1;', dom))
        if len(strokes) >= 2:
            break
    assert len(strokes) >= 2, "the loss chart does not draw the train and the eval line"
    for attempt in range(10):
        chromium_run(chromium, tmp_path, f"--screenshot={shot}", page, profile=f"shot-{attempt}")
        if all(pixels_of(shot, color) > 30 for color in strokes):
            break
    assert all(pixels_of(shot, color) > 30 for color in strokes), f"{shot} does not show both lines"
    print(f"screenshot: {shot} (attempt {attempt + 1})")

    # Custom Scalars (issue 18): evald's layout as TensorBoard serves it (both runs' layouts merged) ...
    assert not [t for t in tags["demo/eval"] if t.endswith("_se")]  # no chart of its own for an SE
    assert {"σ/Loss", "σ/Loss/lower", "σ/Loss/upper", "σ/accuracy/lower"} <= set(tags["demo/eval"])
    layout = get(base, "/data/plugin/custom_scalars/layout")
    titles = [c["title"] for c in layout["category"]]
    first = layout["category"][0]
    assert first["title"] == "loss" and titles[-1] == "evald" and layout["category"][-1].get("closed")
    assert [c["title"] for c in first["chart"]] == ["loss (train and eval)", "eval loss ± SE"]
    assert first["chart"][0]["multiline"]["tag"] == ["^Loss$"]
    assert first["chart"][1]["margin"]["series"] == [{"value": "σ/Loss", "lower": "σ/Loss/lower",
                                                      "upper": "σ/Loss/upper"}]
    assert len(titles) == len(set(titles))  # the two runs' layouts merged, not repeated
    # ... the samples first among the texts (TensorBoard's Text page sorts the tags) ...
    text_tags = get(base, "/data/plugin/text/tags")["demo/eval"]
    assert sorted(text_tags)[0].startswith("Samples/"), sorted(text_tags)
    # ... and the first screen of the Custom Scalars page: the first chart draws a line per run (the
    # palette's colours), the second the eval loss with its ±SE band (the line colour, lightened).
    page = f"{base}/?forceSVG=true#custom_scalars"
    shot = tmp_path / "custom_scalars.png"
    for attempt in range(10):
        chromium_run(chromium, tmp_path, f"--screenshot={shot}", page, profile=f"custom-{attempt}")
        lines = [c for c in PALETTE if pixels_of(shot, c, LOSS_CHART) > 30]
        band = pixels_of(shot, BAND, MARGIN_CHART, tolerance=30)
        if len(lines) >= 2 and band > 100:
            break
    assert len(lines) >= 2, f"{shot}: the loss chart does not draw the train and the eval line"
    assert band > 100, f"{shot}: the eval loss chart has no ±SE band ({band} pixels)"
    text_shot = tmp_path / "text.png"  # for whoever looks: the Text page opens on the samples
    chromium_run(chromium, tmp_path, f"--screenshot={text_shot}", f"{base}/#text", profile="text")
    print(f"screenshots: {shot} (attempt {attempt + 1}), {text_shot}")


# TensorBoard's run colours (its default palette) and where the Custom Scalars page draws its first
# two charts in a 1400x1000 window: the plot areas of "loss (train and eval)" and "eval loss ± SE".
PALETTE = ("rgb(255, 112, 67)", "rgb(0, 119, 187)", "rgb(204, 51, 17)", "rgb(51, 187, 238)",
           "rgb(238, 51, 119)", "rgb(0, 153, 136)")
BAND = "rgb(178, 214, 234)"  # rgb(0, 119, 187) at the margin's opacity over white
LOSS_CHART = (440, 150, 720, 335)
MARGIN_CHART = (790, 150, 1070, 335)


def chromium_run(chromium: str, tmp_path: Path, *args: str, profile: str) -> subprocess.CompletedProcess:
    """Each run with a fresh profile: TensorBoard keeps view settings in the browser's storage."""
    result = subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chromium' / profile}",
                             "--window-size=1400,1000", "--virtual-time-budget=30000", *args],
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def pixels_of(png: Path, rgb: str, box: tuple[int, int, int, int] = (300, 190, 1140, 575),
              tolerance: int = 24) -> int:
    """Pixels of the colour ``rgb(r, g, b)`` (nearly) in ``box`` of the 1400x1000 screenshot; by default
    the Time Series page's first card: right of the run list and above the legend (whose dots have
    the same colours, from y 590 down), left of the settings. The plot reaches y 560: with an early train
    loss far above the rest the lines run along its bottom (a box ending at y 470 missed them)."""
    from PIL import Image  # pillow comes with mindspore

    want = tuple(int(v) for v in re.findall(r"\d+", rgb))
    data = Image.open(png).convert("RGB").crop(box).tobytes()
    return sum(1 for pixel in zip(data[0::3], data[1::3], data[2::3])
               if sum(abs(a - b) for a, b in zip(pixel, want)) < tolerance)
