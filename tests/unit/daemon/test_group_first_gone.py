"""Issue 29 item 4: when an eval group fails, the launcher names the rank that ended first."""

from __future__ import annotations

from evald.daemon.eval_group import WorkerProcess, eval_ranks, first_gone, process_ended
from tests.harness import wait_for


def test_the_first_rank_seen_gone_is_named_and_kept():
    seen = {101: (0, 101), 102: (1, 102), 103: (2, 103)}
    assert first_gone(seen, {101: (0, 101), 102: (1, 102), 103: (2, 103)}, None) is None
    first = first_gone(seen, {101: (0, 101), 103: (2, 103)}, None)
    assert first == (1, 102)
    assert first_gone(seen, {}, first) == (1, 102)          # msrun then ends the others: still rank 1
    assert first_gone({}, {}, None) is None


def test_a_ranks_own_child_is_not_a_rank_and_its_end_names_nobody():
    """A fork of rank 0 (MindSpore's ``sh -c``, before its exec) has rank 0's command line and environment.
    CI once named rank 0 as the first to end after rank 1 was killed; rank 0 ran 40 s longer."""
    rank_0, rank_1, fork_of_0 = WorkerProcess(101, 50, 0), WorkerProcess(102, 50, 1), WorkerProcess(201, 101, 0)
    seen = eval_ranks([rank_0, rank_1, fork_of_0])
    assert seen == {101: (0, 101), 102: (1, 102)}
    assert first_gone(seen, eval_ranks([rank_0, rank_1]), None) is None   # the fork exec'd or ended
    assert first_gone(seen, eval_ranks([rank_0, fork_of_0]), None) == (1, 102)


def test_a_killed_rank_has_ended_while_still_a_zombie_msrun_has_not_reaped():
    """msrun ends the other ranks about half a second after one dies (seen on a real group): the launcher
    must count the killed rank as ended from its death on, not from msrun reaping it."""
    import signal
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert not process_ended(child.pid)
        child.send_signal(signal.SIGKILL)
        wait_for(lambda: process_ended(child.pid), 10, "the killed child to be a zombie")   # not reaped yet
        assert open(f"/proc/{child.pid}/stat").read().split(") ")[1][0] == "Z"
    finally:
        child.kill()
        child.wait()
    assert process_ended(child.pid)
