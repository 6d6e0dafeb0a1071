"""The fleet recipes in deploy/fleet/ as far as they can be checked without a cluster and without a run:
the Indexed Job manifest through kubernetes-validate --strict (the API's schemas), its fields a fleet
needs, and the Slurm array script's shell syntax. Running them with the engines' variables is in
tests/e2e/test_fleet_backfill.py (it needs a backfilled run)."""

from __future__ import annotations

import subprocess

from tests.e2e.test_deploy import DEPLOY, tool


def test_the_indexed_job_passes_the_api_schemas_and_retries_each_index_alone(tmp_path):
    import yaml

    validate = tool("kubernetes-validate", "pip install -e .[test]")
    manifest = DEPLOY / "fleet" / "backfill-indexed-job.yaml"
    done = subprocess.run([validate, "--strict", str(manifest)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "passed" in done.stdout, done.stdout + done.stderr
    (job,) = [d for d in yaml.safe_load_all(manifest.read_text()) if d]
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed" and spec["backoffLimitPerIndex"] >= 1
    assert spec["template"]["spec"]["restartPolicy"] == "Never"          # backoffLimitPerIndex requires it
    broken = tmp_path / "broken.yaml"                                    # the validator does refuse
    broken.write_text(manifest.read_text().replace("backoffLimitPerIndex:", "backoffLimitPerIndx:"))
    assert subprocess.run([validate, "--strict", str(broken)], capture_output=True, text=True,
                          timeout=300).returncode != 0


def test_the_slurm_array_script_parses_and_refuses_to_run_outside_an_array(tmp_path):
    script = DEPLOY / "fleet" / "backfill_array.sbatch"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True, timeout=60).returncode == 0
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "CKPT_DIR": str(tmp_path), "FLEET_DIR": str(tmp_path / "f"),
                               "SUITE": "mc", "EVALD_CONFIG": str(tmp_path / "evald.toml"), "EVALD": "false"})
    assert done.returncode != 0 and "submit this script as a job array" in done.stderr
