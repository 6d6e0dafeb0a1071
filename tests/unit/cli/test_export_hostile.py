"""``evald export`` as a hostile user would try it (issue 35): links and FIFOs planted in ``--out``, an
``--out`` that is no directory, an export that fails midway, a lone surrogate in a per-sample file, a
run named by ``--run-dir`` alone. Each must end in a clear error (exit 2) with ``--out`` as it was and
nothing written outside it; a run on a real lm-eval task, in process."""

from __future__ import annotations

import gzip
import os
import threading
from pathlib import Path

import pytest

from evald.cli.main import main
from tests.export_runs import SUITE, TASK, build_run, documents, include_dir, suite_identity, tree

pytest.importorskip("lm_eval")


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    include = include_dir(tmp_path_factory.mktemp("bench"))
    return include, suite_identity(include)


@pytest.fixture
def run(tmp_path, demo):
    """``(run_dir, config)`` of a run with the ``mc`` cells of steps 30 and 40."""
    include, identity = demo
    return build_run(tmp_path, include, identity, steps=(30, 40))


def _export(capsys, run_dir: Path, config: Path, out: Path, *more: str) -> tuple[int, str]:
    code = main(["export", "--run-dir", str(run_dir), "--config", str(config), "--out", str(out), *more])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def _in_time(call, seconds: float = 60.0):
    """``call()``'s result, failing (not hanging) when it has not returned within ``seconds``."""
    result: list = []
    worker = threading.Thread(target=lambda: result.append(call()), daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"still running after {seconds} s (blocked on a FIFO?)"
    return result[0]


# -- case 5: the run directory is enough to find the run ---------------------------------------------

def test_a_run_named_by_run_dir_is_exported_with_a_toml_that_has_no_ckpt_dir(tmp_path, demo, capsys):
    include, identity = demo
    run_dir, config = build_run(tmp_path, include, identity, toml_ckpt_dir=False)
    assert "ckpt_dir" not in config.read_text()
    code, said = _export(capsys, run_dir, config, tmp_path / "out")
    assert code == 0, said
    assert "1 cell(s) (mc@30)" in said and len([p for p in (tmp_path / "out").rglob("*") if p.is_file()]) == 5


# -- case 4: --out that is no directory ----------------------------------------------------------------

def test_out_naming_a_regular_file_is_a_clear_error_and_the_file_is_untouched(tmp_path, run, capsys):
    out = tmp_path / "notes.txt"
    out.write_text("mine")
    code, said = _export(capsys, *run, out)
    assert code == 2 and f"--out '{out}' is a regular file, not a directory" in said
    assert "Traceback" not in said and out.read_text() == "mine"


def test_out_naming_a_fifo_or_below_one_is_a_clear_error_without_blocking(tmp_path, run, capsys):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for out, message in ((fifo, "is a FIFO, not a directory"), (fifo / "x", f"{fifo}, on the way to --out")):
        code, said = _in_time(lambda: _export(capsys, *run, out))
        assert code == 2 and message in said, said


def test_out_below_a_regular_file_is_a_clear_error(tmp_path, run, capsys):
    (tmp_path / "file").write_text("x")
    code, said = _export(capsys, *run, tmp_path / "file" / "out")
    assert code == 2 and "is a regular file, not a directory" in said


def test_out_where_no_directory_can_be_made_is_a_clear_error(tmp_path, run, capsys):
    if os.geteuid() == 0:                 # root may write any directory, but creates none in /proc
        out = Path("/proc") / f"evald-export-{os.getpid()}"
    else:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        out = locked / "out"
    code, said = _export(capsys, *run, out)
    assert code == 2 and ("may not write" in said or "cannot be created" in said), said
    assert "Traceback" not in said and not out.exists()


def test_out_through_the_operators_own_link_is_its_target(tmp_path, run, capsys):
    """``--out`` itself is the operator's path: resolved once, links and all (only what is below it is not
    followed)."""
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "alias").symlink_to(real)
    code, said = _export(capsys, *run, tmp_path / "alias" / "out")
    assert code == 0, said
    assert (real / "out" / "hf" / "step_30" / ".eval_results" / f"{SUITE}_{TASK}.yaml").is_file()


# -- case 1: links planted in --out --------------------------------------------------------------------

HF_FILE = f"hf/step_30/.eval_results/{SUITE}_{TASK}.yaml"


@pytest.mark.parametrize("planted", ["hf", "hf/step_30", "lm-eval/mc", HF_FILE])
def test_a_link_planted_in_out_is_refused_and_nothing_outside_is_written(tmp_path, run, capsys, planted):
    out = tmp_path / "out"
    assert _export(capsys, *run, out)[0] == 0
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("keep me")
    victim = outside / "precious" if planted == HF_FILE else outside
    link = out / planted
    before_link = tree(out)
    import shutil

    shutil.rmtree(link) if link.is_dir() else link.unlink()
    link.symlink_to(victim)
    before = tree(out)
    assert before != before_link
    code, said = _export(capsys, *run, out, "--model-name", "other")
    assert code == 2, said
    assert f"{link} is a symbolic link" in said and "never writes through a link" in said
    assert tree(outside) == {"precious": b"keep me"}        # nothing written through the link
    assert tree(out) == before                               # and nothing else either: no half export


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_fifo_or_a_directory_where_a_file_goes_is_refused_without_blocking(tmp_path, run, capsys, kind):
    out = tmp_path / "out"
    where = out / HF_FILE
    where.parent.mkdir(parents=True)
    os.mkfifo(where) if kind == "fifo" else where.mkdir()
    code, said = _in_time(lambda: _export(capsys, *run, out))
    assert code == 2 and f"{where} is a {'FIFO' if kind == 'fifo' else 'directory'}" in said, said
    assert [p.name for p in out.iterdir()] == ["hf"]          # nothing else was put in place


def test_exporting_the_same_cells_again_replaces_the_files_by_their_names(tmp_path, run, capsys):
    out = tmp_path / "out"
    assert _export(capsys, *run, out)[0] == 0
    first = tree(out)
    (out / HF_FILE).write_text("edited")
    os.link(out / HF_FILE, tmp_path / "second-name")          # a hard link: its other name keeps its bytes
    assert _export(capsys, *run, out)[0] == 0
    assert tree(out) == first and (tmp_path / "second-name").read_text() == "edited"


# -- case 2: an export that fails midway leaves --out as it was ----------------------------------------

def test_an_export_failing_midway_leaves_out_as_it_was(tmp_path, run, capsys, monkeypatch):
    out = tmp_path / "out"
    assert _export(capsys, *run, out)[0] == 0
    before = tree(out)
    from evald.sinks import hf_eval_results

    def fail(*args, **kwargs):   # the last format: lm-eval's and Every Eval Ever's files are written by now
        raise RuntimeError("the disk went away")

    monkeypatch.setattr(hf_eval_results, "write", fail)
    with pytest.raises(RuntimeError, match="the disk went away"):
        _export(capsys, *run, out, "--model-name", "renamed")
    assert tree(out) == before                 # no file of the failed export, no staging directory left


def test_a_fresh_out_is_not_left_behind_by_a_failed_export(tmp_path, demo, capsys):
    include, identity = demo
    bad = documents()
    bad[1]["target"] = "\ud800"                   # refused when read back (case 3)
    run_dir, config = build_run(tmp_path, include, identity, samples=bad)
    code, said = _export(capsys, run_dir, config, tmp_path / "new" / "out")
    assert code == 2 and not (tmp_path / "new").exists()


# -- case 3: a lone surrogate in a per-sample file ----------------------------------------------------

@pytest.mark.parametrize("line", [b'{"doc_id": 1, "target": "\\ud800", "resps": [], "metrics": {"acc": 1}}\n',
                                  b'{"doc_id": 1, "target": "1", "resps": [["\\udfff"]], "metrics": {"acc": 1}}\n',
                                  b'{"doc_id": 1, "target": "1", "\\ud800": 1, "resps": [], "metrics": {"acc": 1}}\n'])
def test_a_lone_surrogate_in_a_samples_file_is_refused_naming_it_and_nothing_is_written(tmp_path, run, capsys,
                                                                                       line):
    run_dir, config = run
    out = tmp_path / "out"
    assert _export(capsys, run_dir, config, out, "--step", "40")[0] == 0
    before = tree(out)
    (samples,) = (run_dir / "samples" / SUITE / TASK).glob("step_30.*.jsonl.gz")
    samples.write_bytes(gzip.compress(b'{"doc_id": 0, "target": "1", "resps": [], "metrics": {"acc": 0}}\n' + line))
    code, said = _export(capsys, run_dir, config, out)
    assert code == 2, said
    assert f"{samples} line 2" in said and "lone surrogate" in said and "Traceback" not in said
    assert tree(out) == before


# -- what export reads: the ledger and the cells it records ----------------------------------------------

@pytest.mark.parametrize("kind", ["fifo", "garbage", "link"])
def test_a_ledger_that_is_a_fifo_garbage_or_a_link_is_a_clear_error(tmp_path, run, capsys, kind):
    run_dir, config = run
    ledger = run_dir / "ledger.sqlite"
    real = ledger.read_bytes()
    ledger.unlink()
    if kind == "fifo":
        os.mkfifo(ledger)
    elif kind == "garbage":
        ledger.write_bytes(b"not a database " * 100)
    else:
        (tmp_path / "elsewhere.sqlite").write_bytes(real)
        ledger.symlink_to(tmp_path / "elsewhere.sqlite")
    code, said = _in_time(lambda: _export(capsys, run_dir, config, tmp_path / "out"))
    assert code == 2 and f"{ledger}" in said and "cannot be read as evald's ledger" in said, said
    assert "Traceback" not in said and not (tmp_path / "out").exists()


@pytest.mark.parametrize("provenance", [{"identity": {"tasks": {TASK: {}}}},                       # no hash
                                        {"identity": {"tasks": [TASK]}, "identity_sha256": "ab" * 32},
                                        {"identity": {"tasks": {TASK: "x"}}, "identity_sha256": "ab" * 32},
                                        {"identity": "x", "identity_sha256": "ab" * 32},
                                        {"identity": {"tasks": {TASK: {}}, "num_fewshot": "5"},
                                         "identity_sha256": "ab" * 32}])
def test_a_cell_whose_recorded_identity_is_malformed_is_a_clear_error(tmp_path, run, capsys, provenance):
    """A fleet's merge records what a worker's cell file said: export reads it as input."""
    from evald.ledger.ledger import EVALUATED, Ledger

    run_dir, config = run
    ledger = Ledger(run_dir / "ledger.sqlite")
    ledger.take_cell(50, SUITE, "ce" * 32, EVALUATED, metrics={"x": 1.0}, provenance=provenance)
    ledger.close()
    code, said = _export(capsys, run_dir, config, tmp_path / "out", "--step", "50")
    assert code == 2 and "the mc cell of step 50" in said and "Traceback" not in said, said


def test_a_task_name_in_the_ledger_that_is_a_path_is_a_clear_error(tmp_path, run, capsys, demo):
    from evald.ledger.ledger import EVALUATED, Ledger
    from evald.ledger.samples import identity_digest

    run_dir, config = run
    identity = {**demo[1], "tasks": {"../../outside": {"config_sha256": "0" * 64}}}
    ledger = Ledger(run_dir / "ledger.sqlite")
    ledger.take_cell(50, SUITE, "ce" * 32, EVALUATED, metrics={"x": 1.0},
                     provenance={"identity": identity, "identity_sha256": identity_digest(identity)})
    ledger.close()
    code, said = _export(capsys, run_dir, config, tmp_path / "out", "--step", "50")
    assert code == 2 and "is not a plain name" in said, said


def test_an_aggregate_flagged_not_finite_is_left_out_not_a_traceback(tmp_path, demo, capsys):
    """lm-eval's standard error of one document is NaN: the sidecar holds null (flagged) for it."""
    run_dir, config = build_run(tmp_path, *demo, aggregates={"acc": 1.0, "acc_stderr": float("nan")})
    code, said = _export(capsys, run_dir, config, tmp_path / "out", "--format", "hf")
    assert code == 0, said
    (path,) = (tmp_path / "out" / "hf" / "step_30" / ".eval_results").glob("*.yaml")
    assert "standard error" not in path.read_text() and "value: 1.0" in path.read_text()
