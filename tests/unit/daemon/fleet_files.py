"""What the fleet tests share: a small real run (a ledger with retained steps), cell bodies as a worker
writes them (identity, its hash, the cell identity, per-task metrics and samples all consistent), and a
snapshot of a file tree to show that nothing outside the run directory changed."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from evald.daemon.fleet_key import FleetKey, fleet_key
from evald.ledger.ledger import EVALUATED, Ledger, Record
from evald.ledger.samples import identity_digest
from tests.bounded import within

SUITE = "mc"
NETWORK = "0123456789abcdef"       # the cell identity's network half


def identity(suite: str = SUITE, tasks: tuple[str, ...] = ("t",)) -> dict:
    return {"suite": suite, "lm_eval": "0.4.13", "tasks": {t: {"documents": 3} for t in tasks}, "num_fewshot": 0}


def cell_identity(suite: str = SUITE, tasks: tuple[str, ...] = ("t",), network: str = NETWORK) -> str:
    return f"{identity_digest(identity(suite, tasks))}.{network}"


def body(step: int, acc: float = 0.5, *, suite: str = SUITE, tasks: tuple[str, ...] = ("t",),
         network: str = NETWORK) -> dict:
    """An evaluated cell as fleet.py's _run_cell writes it."""
    samples = [{"doc_id": i, "target": "1", "resps": [[-1.0, True]], "metrics": {"acc": float(i % 2)}} for i in range(3)]
    ident = identity(suite, tasks)
    return {"suite": suite, "step": step, "cell_identity": cell_identity(suite, tasks, network), "state": EVALUATED,
            "source": f"step_{step}", "commit_time": 1000.0 + step, "identity": ident,
            "identity_sha256": identity_digest(ident), "provenance": {"weights_sha256": "ab" * 32},
            "scalars": {f"{suite}/{t}/{m}": v for t in tasks for m, v in (("acc", acc), ("acc_stderr", 0.1))},
            "tasks": {t: {"metrics": {"acc": acc, "acc_stderr": 0.1}, "samples": samples} for t in tasks},
            "samples_text": "doc 0", "timing": {"evaluate_s": 1.0, "load_s": 0.1, "compiled_graphs": 2}}


def make_run(root: Path, steps=(10, 20, 30)) -> Path:
    """``root/run``: a ledger whose ``steps`` are retained checkpoints, validated."""
    run = root / "run"
    run.mkdir()
    ledger = Ledger(run / "ledger.sqlite")
    for step in steps:
        ledger.admit(name=f"step_{step}", step=step, kind="evald", found_via="scan", run_id="r", commit_time=1.0)
        ledger.start(step)
        ledger.finish(step, EVALUATED, metrics={"eval/loss": 1.0}, identity="v" * 64,
                      record=Record("eval", step, 1.0, {"eval/loss": 1.0}, {}))
    ledger.mark_written([r.id for r in ledger.pending_records()])   # as the run's evald did
    ledger.close()
    return run


def run_key(run: Path) -> FleetKey:
    """The run's fleet key, RUN_DIR/fleet.key, as the first worker creates it."""
    return fleet_key(run, None, create=True)


def tree(root: Path, *, skip: Path | None = None) -> dict[str, tuple]:
    """Every entry below ``root`` (not following links, leaving out ``skip``): its kind, size and mtime."""
    found = {}
    for here, dirs, files in os.walk(root):
        if skip is not None and Path(here) == skip:
            dirs[:] = []
            continue
        for name in dirs + files:
            path = Path(here) / name
            if skip is not None and path == skip:
                continue
            info = path.lstat()
            found[str(path.relative_to(root))] = (stat.S_IFMT(info.st_mode), info.st_size if stat.S_ISREG(
                info.st_mode) else 0, info.st_mtime_ns if stat.S_ISREG(info.st_mode) else 0)
    return found


BOUND_S = 60     # "no hang": a merge of a handful of small files takes well under a second


def within_bound(call, *fifos: Path):
    """``call()`` must end within BOUND_S; a FIFO it blocks on is then opened from the other side so the
    thread ends and the test reports the hang instead of hanging."""
    return within(BOUND_S, call, release=fifos, what="still running (blocked on a FIFO)")
