"""A fleet worker's index and count: the options, a Slurm array's variables, a Kubernetes Indexed Job's."""

from __future__ import annotations

import pytest

from evald.cli.fleet import IndexError_, worker_index


def test_the_options_win_over_the_engines_variables():
    which = worker_index(1, 3, {"SLURM_ARRAY_TASK_ID": "7", "SLURM_ARRAY_TASK_COUNT": "9"})
    assert (which.index, which.count) == (1, 3)


def test_a_slurm_array_task_counts_from_the_arrays_minimum_in_its_stride():
    env = {"SLURM_ARRAY_TASK_ID": "12", "SLURM_ARRAY_TASK_MIN": "10", "SLURM_ARRAY_TASK_COUNT": "3"}
    assert (worker_index(None, None, env).index, worker_index(None, None, env).count) == (2, 3)
    stepped = {"SLURM_ARRAY_TASK_ID": "14", "SLURM_ARRAY_TASK_MIN": "10", "SLURM_ARRAY_TASK_STEP": "2",
               "SLURM_ARRAY_TASK_COUNT": "3"}       # --array=10-14:2
    assert worker_index(None, None, stepped).index == 2
    assert worker_index(None, None, {"SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_TASK_COUNT": "1"}).index == 0


def test_a_kubernetes_indexed_job_gives_the_index_and_the_manifest_the_count():
    which = worker_index(None, None, {"JOB_COMPLETION_INDEX": "3", "EVALD_WORKER_COUNT": "4"})
    assert (which.index, which.count, which.source) == (3, 4, "JOB_COMPLETION_INDEX, EVALD_WORKER_COUNT")
    assert worker_index(None, 5, {"JOB_COMPLETION_INDEX": "4"}).count == 5


@pytest.mark.parametrize("index, count, env, says", [
    (None, None, {}, "which worker is this"),
    (None, None, {"JOB_COMPLETION_INDEX": "1"}, "which worker is this"),       # no count
    (3, 3, {}, "must be in [0, count)"),
    (None, None, {"SLURM_ARRAY_TASK_ID": "5", "SLURM_ARRAY_TASK_MIN": "6", "SLURM_ARRAY_TASK_COUNT": "2"},
     "must be in [0, count)"),
    (None, None, {"SLURM_ARRAY_TASK_ID": "x", "SLURM_ARRAY_TASK_COUNT": "2"}, "not a whole number"),
    (None, None, {"SLURM_ARRAY_TASK_ID": "11", "SLURM_ARRAY_TASK_MIN": "10", "SLURM_ARRAY_TASK_STEP": "2",
                  "SLURM_ARRAY_TASK_COUNT": "3"}, "stride"),
])
def test_a_missing_or_impossible_index_is_a_clear_error(index, count, env, says):
    with pytest.raises(IndexError_, match=says.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        worker_index(index, count, env)


# issue 35: int() reads Arabic-Indic digits, underscores, a sign and surrounding white space, so
# JOB_COMPLETION_INDEX="١" was worker 1 and "1_0" worker 10. An engine writes ASCII digits; anything
# else is a clear error naming the variable.
NOT_ASCII_DIGITS = ["\u0661", "1_0", "\u0661\u0660", "+1", "-0", " 1", "1\n", "0x1", "1.0", "\uff11", "9" * 5000]


@pytest.mark.parametrize("value", NOT_ASCII_DIGITS)
@pytest.mark.parametrize("name, env", [
    ("JOB_COMPLETION_INDEX", {"EVALD_WORKER_COUNT": "20"}),
    ("EVALD_WORKER_COUNT", {"JOB_COMPLETION_INDEX": "0"}),
    ("SLURM_ARRAY_TASK_ID", {"SLURM_ARRAY_TASK_COUNT": "20"}),
    ("SLURM_ARRAY_TASK_COUNT", {"SLURM_ARRAY_TASK_ID": "0"}),
    ("SLURM_ARRAY_TASK_MIN", {"SLURM_ARRAY_TASK_ID": "10", "SLURM_ARRAY_TASK_COUNT": "20"}),
    ("SLURM_ARRAY_TASK_STEP", {"SLURM_ARRAY_TASK_ID": "10", "SLURM_ARRAY_TASK_COUNT": "20"}),
])
def test_an_index_or_count_from_the_environment_is_ascii_digits_in_full(name, env, value):
    with pytest.raises(IndexError_, match=f"{name}=.*ASCII digits"):
        worker_index(None, None, {**env, name: value})


@pytest.mark.parametrize("value", NOT_ASCII_DIGITS)
@pytest.mark.parametrize("option", ["--worker-index", "--worker-count"])
def test_an_index_or_count_option_is_ascii_digits_in_full(tmp_path, capsys, option, value):
    from evald.cli.commands import run as command

    with pytest.raises(SystemExit) as exited:
        command("backfill", ["--run-dir", str(tmp_path), "--fleet-dir", str(tmp_path / "f"), "--suite", "mc",
                             option, value])
    assert exited.value.code == 2 and "ASCII digits" in capsys.readouterr().err
