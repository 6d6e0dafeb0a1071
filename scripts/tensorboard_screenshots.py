"""Screenshots of TensorBoard on a log directory, for the docs (docs/images/tensorboard-*.png): a real
``tensorboard`` (default flags) and headless Chromium, each page in a fresh browser profile, so at
TensorBoard's default settings (smoothing 0.6, outliers ignored), as a user first sees it.

    PYTHONPATH=. .venv/bin/python scripts/tensorboard_screenshots.py LOGDIR [OUT_DIR]

The docs' images come from the demo's log directory (./scripts/demo.sh prints it).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

# file -> (the page's address after the server's, window size): the first screen of each page, the
# Custom Scalars page down to its first benchmark suite's charts, and the Text page filtered to the
# suites' tables of results (the hash's tagFilter is the Text page's filter box)
PAGES = {
    "tensorboard-time-series.png": ("?forceSVG=true#timeseries", "1400,1000"),
    "tensorboard-custom-scalars.png": ("?forceSVG=true#custom_scalars", "1400,1500"),
    "tensorboard-text.png": ("?forceSVG=true#text", "1400,1000"),
    "tensorboard-suite-results.png": ("?forceSVG=true#text&tagFilter=%2Fresults", "1400,1000"),
}
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
         "--virtual-time-budget=30000")


def main(logdir: str, out_dir: str = "docs/images") -> int:
    chromium = shutil.which("chromium-headless-shell") or shutil.which("chromium")
    if chromium is None:
        print("no headless Chromium (apt-get install -y chromium-headless-shell)", file=sys.stderr)
        return 2
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        log = open(Path(tmp) / "tensorboard.log", "w+")
        server = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", logdir, "--host",
                                   "127.0.0.1", "--port", "0"], stdout=log, stderr=subprocess.STDOUT)
        try:
            base = None
            for _ in range(240):
                found = re.search(r"at (http://127\.0\.0\.1:\d+)/", Path(log.name).read_text())
                if found:
                    base = found.group(1)
                    break
                time.sleep(0.5)
            assert base, Path(log.name).read_text()
            for _ in range(60):  # until its data server has read the runs
                with urllib.request.urlopen(f"{base}/data/plugin/scalars/tags", timeout=30) as response:
                    if len(response.read()) > 10:
                        break
                time.sleep(1)
            time.sleep(6)
            for name, (page, size) in PAGES.items():
                subprocess.run([chromium, *FLAGS, f"--window-size={size}", f"--user-data-dir={tmp}/profile-{name}",
                                f"--screenshot={out / name}", f"{base}/{page}"],
                               check=True, capture_output=True, timeout=240)
                print(out / name)
        finally:
            server.terminate()
            server.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
