"""The deploy recipes, exercised as far as they can run on one machine without a cluster.

* Slurm: the real sbatch script and its per-node script run with the scheduler's variables set
  by the test and a stand-in ``srun`` (runs the command once per node on this machine; Slurm is
  not installed here). Everything else is real: ``evald keys``, msrun starting the training
  script, evald on the spare device, notifications and control over CURVE on loopback TCP.
* systemd: ``systemd-analyze verify`` on the unit (as shipped, and with its key lines enabled),
  and its ExecStart's evald arguments with the example TOML through evald's own parser.
* Kubernetes: every manifest through ``kubernetes-validate --strict`` (the API's schemas), and
  every evald / msrun command line in them through evald's and msrun's own argument parsers.

These tools are part of the test set-up (pyproject's ``test`` extra; systemd is in the image,
and scripts/setup_env.sh installs it if not). A missing tool FAILS the test with how to install
it: a deploy check that silently skips would let a broken recipe land.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from evald.cli.main import parse_config
from evald.config import ConfigError, option_fields
from tests import faults
from tests.harness import base_env, hook_stats

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
VENV_BIN = Path(sys.executable).parent
MANIFESTS = sorted((DEPLOY / "k8s").glob("*.yaml"))
KNOWN_ENV = ({f.metadata["env"] for f in option_fields() if f.metadata.get("env")}
             | {"EVALD_ENDPOINT", "EVALD_CONTROL_ENDPOINT", "EVALD_SOCKET_DIR", "EVALD_RUN_ID", "EVALD_CLIENT_KEY",
                "EVALD_SERVER_PUBLIC_KEY", "EVALD_SERVER_KEY", "EVALD_ALLOWED_KEYS", "EVALD_ALLOW_PLAINTEXT"})

FAKE_SRUN = """#!/bin/bash
# Stand-in for Slurm's srun on one machine: drop srun's options, run the command once per node.
while [[ $# -gt 0 && $1 == --* ]]; do shift; done
status=0
for ((node = 0; node < SLURM_NNODES; node++)); do
    SLURM_NODEID=$node SLURM_PROCID=$node SLURM_LOCALID=0 "$@" || status=$?
done
exit $status
"""


def tool(name: str, install: str) -> str:
    found = (VENV_BIN / name) if (VENV_BIN / name).exists() else shutil.which(name)
    if not found:
        pytest.fail(f"{name} is needed by the deploy tests and is missing: {install}")
    return str(found)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- Slurm --------------------------------------------------------------------------------------

def test_slurm_job_trains_under_msrun_with_evald_on_the_spare_device(tmp_path):
    tool("msrun", "pip install -e .[test] (mindspore provides msrun)")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(FAKE_SRUN)
    (bin_dir / "srun").chmod(0o755)
    run = tmp_path / "run"
    env = base_env({
        "PATH": f"{bin_dir}{os.pathsep}{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "SLURM_JOB_ID": "4242", "SLURM_NNODES": "1", "SLURM_JOB_NODELIST": "localhost",
        "SLURM_SUBMIT_DIR": str(REPO), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
        "EVALD_PORT": str(free_port()), "DEVICES_PER_NODE": "2", "RUN": str(run),
        "TRAIN_SCRIPT": "examples/tiny_lm/train.py", "TRAIN_ARGS": "--steps 40 --every 20 --cpu 0",
        "EVALD_ARGS": '--cpu-affinity 1 --lag-policy all --subset-size 64 --batch-size 16 --generation {"prompts":0}',
    })
    for name in ("EVALD_SOCKET_DIR", "EVALD_ENDPOINT", "EVALD_CONTROL_ENDPOINT"):
        env.pop(name, None)
    done = subprocess.run(["bash", str(DEPLOY / "slurm_train_with_evald.sbatch")], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=900)
    evald_log = (run / "evald.log").read_text(errors="replace") if (run / "evald.log").exists() else ""
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:] + evald_log[-3000:]
    trainer_log = (run / "msrun" / "node0" / "worker_0.log").read_text(errors="replace")
    rows = faults.ledger_rows(run / "ckpt")
    assert [(r["step"], r["state"]) for r in rows] == [(20, "evaluated"), (40, "evaluated")]
    received = re.search(r"notification channel: \{'received': (\d+), 'untrusted': (\d+)", evald_log)
    assert received and int(received.group(1)) > 0 and received.group(2) == "0"  # CURVE-authenticated messages
    assert "PLAINTEXT" not in evald_log + trainer_log
    assert "ids=(1,)}  (command line --device)" in evald_log  # the spare device: msrun's worker used 0
    assert hook_stats(trainer_log)["notifications_sent"] > 0
    assert oct((run / "keys" / "evald-host").stat().st_mode & 0o777) == "0o700"


# --- systemd ------------------------------------------------------------------------------------

def verify_unit(unit_text: str, directory: Path) -> str:
    """systemd-analyze verify's complaints about the unit (empty when it is clean)."""
    analyze = tool("systemd-analyze", "apt-get install systemd (scripts/setup_env.sh does it)")
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "evald@.service").write_text(unit_text)
    done = subprocess.run([analyze, "verify", str(directory / "evald@exp1.service")], capture_output=True,
                          text=True, timeout=120)
    return (done.stdout + done.stderr).strip() + ("" if done.returncode == 0 else f"\nexit {done.returncode}")


def test_systemd_unit_verifies_as_shipped_and_with_its_keys_enabled(tmp_path):
    shipped = (DEPLOY / "evald@.service").read_text()
    evald = tool("evald", "pip install -e .")
    local = shipped.replace("/srv/training/evald/.venv/bin/evald", evald)
    assert verify_unit(local, tmp_path / "plain") == ""
    with_keys = re.sub(r"^#(LoadCredential=|Environment=EVALD_SERVER_KEY)", r"\1", local, flags=re.M)
    assert with_keys.count("\nLoadCredential=") == 1
    assert verify_unit(with_keys, tmp_path / "keys") == ""
    assert "Unknown key" in verify_unit(local.replace("KillMode=", "KilMode="), tmp_path / "typo")  # it can fail
    exec_start = re.search(r"^ExecStart=(\S+) (.*)$", shipped, flags=re.M).group(2).split()
    args = [str(DEPLOY / "exp1.toml") if a == "/etc/evald/%i.toml" else a for a in exec_start]
    config = parse_config(args, environ={}).config
    assert config.serve_forever and str(config.device) == "7" and config.generation.prompts == 4


# --- Kubernetes ---------------------------------------------------------------------------------

def manifests() -> list[tuple[Path, dict]]:
    try:
        import yaml
    except ImportError:
        pytest.fail("PyYAML is needed by the deploy tests: pip install -e .[test]")
    return [(path, doc) for path in MANIFESTS for doc in yaml.safe_load_all(path.read_text()) if doc]


def containers(doc: dict) -> list[dict]:
    spec = doc.get("spec", {})
    pod = spec.get("template", {}).get("spec", {}) if "template" in spec else {}
    return pod.get("initContainers", []) + pod.get("containers", [])


def test_kubernetes_manifests_pass_the_api_schemas(tmp_path):
    validate = tool("kubernetes-validate", "pip install -e .[test]")
    assert len(MANIFESTS) >= 3
    done = subprocess.run([validate, "--strict", *map(str, MANIFESTS)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("passed") == sum(1 for _ in manifests())
    broken = tmp_path / "broken.yaml"  # the validator really rejects: a misspelt field
    broken.write_text(MANIFESTS[0].read_text().replace("containers:", "containerz:", 1))
    refused = subprocess.run([validate, "--strict", str(broken)], capture_output=True, text=True, timeout=300)
    assert refused.returncode != 0


def test_kubernetes_command_lines_are_what_evald_and_msrun_accept(monkeypatch):
    seen = {"evald": 0, "msrun": 0}
    for path, doc in manifests():
        for container in containers(doc):
            command = container.get("command", [])
            env = {e["name"]: e.get("value", "") for e in container.get("env", [])}
            unknown = {name for name in env if name.startswith("EVALD_")} - KNOWN_ENV
            assert not unknown, f"{path.name} {container['name']}: unknown variables {unknown}"
            env = {k: v.replace("$(POD_IP)", "127.0.0.1") for k, v in env.items()}
            if command[:1] == ["evald"]:
                seen["evald"] += 1
                try:
                    parse_config(command[1:], environ=env)
                except (ConfigError, SystemExit) as exc:
                    pytest.fail(f"{path.name} {container['name']}: evald refuses {command}: {exc}")
            elif command[:1] == ["msrun"]:
                seen["msrun"] += 1
                from mindspore.parallel.cluster.run import get_args

                monkeypatch.setattr(sys, "argv", command)
                args = get_args()  # msrun's own parser: an unknown flag exits here
                assert args.task_script == "train.py" and "--ckpt-dir" in args.task_script_args
    assert seen == {"evald": 2, "msrun": 2}


def test_the_sidecar_and_the_trainer_share_the_socket_and_checkpoint_volumes():
    (_, job), = [(p, d) for p, d in manifests() if p.name == "train-with-evald-sidecar.yaml"]
    trainer, evald = containers(job)
    for key in ("EVALD_SOCKET_DIR",):
        assert {e["name"]: e["value"] for e in trainer["env"]}[key] == {e["name"]: e["value"] for e in evald["env"]}[key]
    assert trainer["volumeMounts"] == evald["volumeMounts"]
    ckpt = evald["command"][evald["command"].index("--ckpt-dir") + 1]
    assert ckpt == trainer["command"][trainer["command"].index("--ckpt-dir") + 1]
    remote = {d["kind"]: d for p, d in manifests() if p.name == "evald-deployment.yaml"}
    assert remote["Deployment"]["spec"]["replicas"] == 1 and remote["Deployment"]["spec"]["strategy"]["type"] == "Recreate"
    ports = {p["port"] for p in remote["Service"]["spec"]["ports"]}
    (_, trainer_job), = [(p, d) for p, d in manifests() if p.name == "train-with-remote-evald.yaml"]
    trainer_env = {e["name"]: e["value"] for e in containers(trainer_job)[-1]["env"]}
    assert {int(trainer_env[k].rsplit(":", 1)[1]) for k in ("EVALD_ENDPOINT", "EVALD_CONTROL_ENDPOINT")} == ports
    assert json.dumps(trainer_env).count("/keys/") == 2
