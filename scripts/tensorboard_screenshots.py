"""Screenshots of TensorBoard's first screen, Custom Scalars and Text pages on a log directory, for the
docs (docs/images/tensorboard-*.png): a real ``tensorboard`` (default flags) and headless Chromium.

    PYTHONPATH=. .venv/bin/python scripts/tensorboard_screenshots.py LOGDIR [OUT_DIR]
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

PAGES = {"tensorboard-time-series.png": "#timeseries", "tensorboard-custom-scalars.png": "#custom_scalars",
         "tensorboard-text.png": "#text"}
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
         "--window-size=1400,1000", "--virtual-time-budget=30000")


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
            for name, page in PAGES.items():
                subprocess.run([chromium, *FLAGS, f"--user-data-dir={tmp}/profile-{name}",
                                f"--screenshot={out / name}", f"{base}/?forceSVG=true{page}"],
                               check=True, capture_output=True, timeout=240)
                print(out / name)
        finally:
            server.terminate()
            server.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
