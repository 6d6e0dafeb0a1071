"""Evaluation beside training from the first checkpoint (issue 26, item 5): building benchmark suites
(lm-eval's tasks, the scorer's graphs: tens of seconds each on a loaded machine) never delays a
checkpoint's validation. The first checkpoint is validated before any suite is built; the suites are
built after it and still cover it; a checkpoint committed while a suite builds is validated before that
suite is ready (it waits for one of the suite's graphs, not for the whole build). A real evald, real
suites, real files."""

from __future__ import annotations

import json
import re
import signal
import sqlite3

from examples.tiny_lm.benchmarks import write_benchmarks
from tests import faults
from tests.harness import wait_for


def test_the_first_checkpoint_is_validated_before_the_suites_are_built_and_they_catch_up(tmp_path, procs):
    include = write_benchmarks(tmp_path / "bench", next_line_count=40, bpb_docs_per_set=2)
    config = tmp_path / "evald.toml"
    config.write_text('tokenizer_factory = "examples.tiny_lm.benchmarks:build_tokenizer"\n'
                      f'[suites.mc]\ninclude_path = [{json.dumps(include)}]\ntasks = ["stdlib_next_line"]\n'
                      'limit = 16\nbatch_size = 4\n')
    ckpt = tmp_path / "ckpt"
    faults.announce(ckpt)
    evald = faults.start(tmp_path, ckpt, "--config", str(config), env={"HF_HOME": str(tmp_path / "hf")})
    procs.append(evald)
    # the demo's order: the network is ready, evald is idle, then training commits its first checkpoint
    wait_for(lambda: "evaluation network ready" in evald.output(), 300, "the evaluation network built")
    faults.commit(ckpt, 10)
    wait_for(lambda: "building suite mc" in evald.output(), 600, "the suite's build to start")
    faults.commit(ckpt, 20)
    wait_for(lambda: "step 10 suite mc:" in evald.output() and "step 20 suite mc:" in evald.output(), 600,
             "the suite caught up with steps 10 and 20")
    evald.signal(signal.SIGTERM)
    assert evald.wait(120) == 0, evald.output()[-3000:]
    log = evald.output()
    validated = re.search(r"step 10: .*loss=", log)
    built = re.search(r"suite mc ready in", log)
    assert validated and built, log[-3000:]
    assert validated.start() < built.start(), "the suite was built before the first validation"
    second = re.search(r"step 20: .*loss=", log)
    assert second and second.start() < built.start(), "step 20 waited for the whole suite build"
    db = sqlite3.connect(faults.ledger_path(ckpt))
    try:
        cells = db.execute("SELECT step, state FROM cells WHERE superseded_by IS NULL").fetchall()
    finally:
        db.close()
    assert sorted(cells) == [(10, "evaluated"), (20, "evaluated")]   # it caught up with the steps validated before it
