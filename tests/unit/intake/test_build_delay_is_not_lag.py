"""Issue 18 item 4: a build's delay must not look like lag.

evald that learns its factories from the run announcement builds its network while the
first checkpoints arrive; the ``latest`` lag policy then saw two queued steps and skipped
the older one as superseded. The policy judges from the moment evald could first evaluate
(``CatchUp``): a run whose evaluation keeps up loses none of its first checkpoints, and one
whose evaluation does not keep up still skips. A pure simulation on a virtual clock."""

from __future__ import annotations

from evald.intake.lag_policy import CatchUp, decide


def simulate(*, interval_s: float, evaluate_s: float, ready_at: float, steps: int, started_at: float = 0.0,
             already_there: int = 0) -> tuple[list[int], list[int]]:
    """Checkpoints every ``interval_s`` (step 5, 10, ...; ``already_there`` of them before evald started),
    the network ready at ``ready_at``; returns (evaluated, skipped) steps in order."""
    commits = {5 * (i + 1): started_at + (i + 1 - already_there) * interval_s for i in range(steps)}
    catch_up = CatchUp(started_at=started_at)
    evaluated: list[int] = []
    skipped: list[int] = []
    now = ready_at
    while len(evaluated) + len(skipped) < steps:
        queued = [(s, t) for s, t in commits.items() if t <= now and s not in evaluated and s not in skipped]
        if not queued:
            now = min(t for s, t in commits.items() if s not in evaluated and s not in skipped)
            continue
        choice = decide("latest", [s for s, _ in queued], catch_up=catch_up.protect(queued))
        skipped += [s for s, _ in choice.skip]
        evaluated.append(choice.evaluate)
        now += evaluate_s
    return evaluated, skipped


def test_a_run_whose_evaluation_keeps_up_loses_none_of_its_first_checkpoints():
    """The reported case: a 37.7 s build, a checkpoint every 6 s, an evaluation of 4 s."""
    evaluated, skipped = simulate(interval_s=6.0, evaluate_s=4.0, ready_at=37.7, steps=20)
    assert skipped == [] and evaluated == sorted(evaluated) == [5 * (i + 1) for i in range(20)]


def test_an_evaluation_that_does_not_keep_up_still_skips_to_the_newest():
    evaluated, skipped = simulate(interval_s=6.0, evaluate_s=15.0, ready_at=37.7, steps=20)
    assert skipped and 100 in evaluated  # the policy applies once the queue grows beyond the build's backlog


def test_checkpoints_there_before_evald_started_are_judged_by_the_policy():
    """A late start on a run that has been going: the old checkpoints are lag, not the build's delay."""
    evaluated, skipped = simulate(interval_s=6.0, evaluate_s=4.0, ready_at=110.0, started_at=100.0, steps=12,
                                  already_there=8)
    assert skipped[:7] == [5, 10, 15, 20, 25, 30, 35] and evaluated[0] == 40


def test_catch_up_ends_once_the_queue_is_down_to_one():
    catch_up = CatchUp(started_at=0.0)
    assert catch_up.protect([(5, 1.0), (10, 2.0)]) == {5, 10}
    assert catch_up.protect([(10, 2.0)]) == frozenset() and catch_up.over  # caught up
    assert catch_up.protect([(15, 3.0), (20, 4.0)]) == frozenset()
