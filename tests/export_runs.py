"""A run with evaluated suite cells, for ``evald export`` tests: real lm-eval tasks (the demo's
``stdlib_next_line`` by default, or its rolling ``bpb_*`` tasks; their config hashes recorded as a suite
runner records them), a ledger holding the cells, their per-sample files written by evald's own writer,
and the TOML naming the suite."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

TASK = "stdlib_next_line"
SUITE = "mc"


def include_dir(base: Path) -> str:
    """The demo benchmarks (a few documents): lm-eval's include path of suite ``mc``."""
    from examples.tiny_lm.benchmarks import write_benchmarks

    return write_benchmarks(base, next_line_count=12, bpb_docs_per_set=1)


def suite_identity(include: str, suite: str = SUITE, tasks: Sequence[str] = (TASK,)) -> dict:
    """The identity of ``suite`` of ``tasks`` (default: ``mc``) as the suite runner records it
    (evald.pipeline.suites.runner)."""
    from evald.pipeline.suites.runner import config_sha256, task_manager

    loaded = task_manager((include,), tuple(tasks)).load(list(tasks))["tasks"]
    return {"suite": suite, "lm_eval": "0.4.test", "tasks": {t: {"config_sha256": config_sha256(loaded[t])}
                                                            for t in tasks}, "num_fewshot": 0}


def documents(count: int = 4) -> list[dict]:
    return [{"doc_id": i, "target": "1", "resps": [[-1.0 - i, False], [-0.5, True]],
             "metrics": {"acc": float(i % 2)}} for i in range(count)]


def build_run(base: Path, include: str, identity: dict, *, steps: Sequence[int] = (30,),
              toml_ckpt_dir: bool = True, samples: list[dict] | None = None,
              aggregates: dict | None = None) -> tuple[Path, Path]:
    """``(run_dir, config)``: ``base/run`` with an evaluated cell of the identity's suite per step (each
    task with ``samples`` and ``aggregates``), and ``base/evald.toml`` (with a ``ckpt_dir`` unless
    ``toml_ckpt_dir`` is False)."""
    from evald.ledger.ledger import EVALUATED, Ledger
    from evald.ledger.samples import identity_digest, write_samples

    digest = identity_digest(identity)
    suite, tasks = identity["suite"], list(identity["tasks"])
    aggregates = aggregates or {"acc": 0.5, "acc_stderr": 0.25}
    run = base / "run"
    run.mkdir(parents=True, exist_ok=True)
    ledger = Ledger(run / "ledger.sqlite")
    try:
        for step in steps:
            ledger.take_cell(step, suite, "ce" * 32, EVALUATED, metrics={f"{suite}/{t}/acc": 0.5 for t in tasks},
                             provenance={"identity": identity, "identity_sha256": digest,
                                         "weights_sha256": f"{step:02d}" * 32})
            for task in tasks:
                write_samples(run, suite=suite, task=task, step=step, identity=identity, identity_sha256=digest,
                              cell_identity="ce" * 32, metrics=aggregates,
                              samples=documents() if samples is None else samples)
    finally:
        ledger.close()
    config = base / "evald.toml"
    config.write_text((f"ckpt_dir = {json.dumps(str(base / 'ckpt'))}\n" if toml_ckpt_dir else "")
                      + f"[suites.{suite}]\ninclude_path = [{json.dumps(include)}]\ntasks = {json.dumps(tasks)}\n")
    return run, config


def tree(out: Path) -> dict[str, bytes | str]:
    """Every entry below ``out``: a file's bytes, a link's target, ``"<dir>"``; no link followed."""
    import os

    found: dict[str, bytes | str] = {}
    for folder, dirs, files in os.walk(out):        # os.walk does not descend into a link
        for name in dirs + files:
            path = Path(folder) / name
            rel = path.relative_to(out).as_posix()
            if path.is_symlink():
                found[rel] = f"-> {os.readlink(path)}"
            elif path.is_dir():
                found[rel] = "<dir>"
            elif path.is_file():
                found[rel] = path.read_bytes()
            else:
                found[rel] = "<special>"
    return dict(sorted(found.items()))
