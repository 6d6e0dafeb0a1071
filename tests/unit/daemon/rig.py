"""The in-process rig for evald's Server: a stand-in pipeline, a configuration on private endpoints, a staged
checkpoint directory, and the loop driven turn by turn (``Server.on_tick``), as tests/unit/daemon/ uses them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from evald.config import EvaldConfig, ResolvedConfig
from evald.contracts import layout, wire
from evald.daemon.server import Server
from evald.ledger.ledger import EVALUATED
from evald.pipeline.network import EvalResult
from evald.pipeline.pipeline import Evaluated
from evald.pipeline.subset import SubsetInfo

RUN_ID = "lifecycle"


class MeanWeightPipeline:
    """Stands in for the MindSpore pipeline (evald.pipeline.pipeline.EvaluationPipeline): reads and verifies
    the real checkpoint files and reports their mean weight as the loss; no suites."""

    validation_identity = "v" * 64

    def __init__(self) -> None:
        self.subset = SubsetInfo.of([0, 1], num_samples=2, requested=2, seed=0)
        self.blocked_reason = None
        self.suites: dict = {}
        self.suites_pending: tuple[str, ...] = ()
        self.suite_errors: dict[str, str] = {}
        self.evaluated: list[int] = []

    def ensure_built(self, config) -> bool:
        return True

    def build_next_suite(self) -> bool:
        return False

    def evaluate(self, ckpt_dir: Path, row) -> Evaluated:
        path = ckpt_dir / row.source
        weights = layout.read_checkpoint(path, layout.read_manifest(path))
        self.evaluated.append(row.step)
        return Evaluated(EvalResult({"eval/loss": float(weights["w"].mean())}, {}, 0.0, 0.0))


def config(tmp_path: Path, sockets: Path | None, **options) -> ResolvedConfig:
    """evald's defaults but: lag policy all, the log directory under tmp_path, and either private ipc endpoints
    in ``sockets`` or no notification channel at all; ``options`` override any of them."""
    endpoints = ({"endpoint": f"ipc://{sockets}/n.sock", "control_endpoint": f"ipc://{sockets}/c.sock"}
                 if sockets else {"endpoint": "none"})
    options = {"logdir": str(tmp_path / "logdir"), "lag_policy": "all", **endpoints, **options}
    config = dataclasses.replace(EvaldConfig(), **options)
    return ResolvedConfig(config, {})


def stage(ckpt: Path, *steps: int, final_step: int | None = None) -> Path:
    """A trainer's directory: RUN.json, a checkpoint (weights all equal to the step) per step, and RUN_END.json
    when ``final_step`` is given."""
    ckpt.mkdir(parents=True, exist_ok=True)
    layout.write_run_file(ckpt, wire.RunAnnounced(run_id=RUN_ID, ckpt_dir=str(ckpt), every_n_steps=10)
                          .encode().decode())
    for step in steps:
        layout.write_checkpoint(ckpt, step, {"w": np.full(4, step, np.float32)}, run_id=RUN_ID)
    if final_step is not None:
        layout.write_run_end(ckpt, wire.RunFinished(run_id=RUN_ID, ckpt_dir=str(ckpt), final_step=final_step)
                             .encode().decode())
    return ckpt


def tick_until(server: Server, predicate, what: str, turns: int = 500) -> None:
    for _ in range(turns):
        assert server.on_tick(), f"the loop stopped before {what}"
        if predicate():
            return
    raise AssertionError(f"not reached in {turns} turns: {what}")


def evaluated(server: Server) -> list[int]:
    return [row.step for row in server.run.ledger.steps(EVALUATED)] if server.run else []


def refused(server: Server, monkeypatch) -> int:
    """What `evald` would exit with: Server.serve, without touching this process's signal handlers."""
    monkeypatch.setattr(server, "install_signal_handlers", lambda: None)
    return server.serve()
