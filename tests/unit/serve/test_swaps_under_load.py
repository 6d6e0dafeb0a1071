"""Under load, with hundreds of hot swaps: every answer comes from the snapshot it names, never a mix.

Clients send echo and generation requests continuously (pinned steps and ``latest``) while evald's
loop, in miniature, swaps a new checkpoint in for every "evaluation", serves between its "batches"
without swapping and between evaluations with swaps. Afterwards a sample of answers is recomputed
from the snapshot each one names (swapped in alone, scored directly): the log-probabilities must be
the same (to float noise far below what separates two snapshots). The checker is shown to catch a mislabelled answer (a swap that names the wrong step).
"""

from __future__ import annotations

import random
import threading
import time

import pytest

ms = pytest.importorskip("mindspore")
httpx = pytest.importorskip("httpx")

from evald.config import ServeOptions  # noqa: E402
from evald.pipeline.network import Held  # noqa: E402
from evald.pipeline.suites.scoring import ScoreRequest  # noqa: E402
from tests.unit.serve.rig import Rig, snapshot  # noqa: E402

STEPS = (10, 20, 30, 40, 50, 60)
# Served values are normally the recomputed ones bit for bit. Once in CI (stage 1, 2026-12-02) one answer of
# 60 differed, by an amount the message did not say, and it was not reproduced in 6 runs beside two CPU hogs:
# float noise of MindSpore's CPU kernels is the likeliest cause, a mixed snapshot is not (in this rig one thread
# swaps and serves). Another snapshot's values differ by more than 1e-2 (the 0.02 noise per weight;
# test_snapshots_differ_far_beyond_the_tolerance), so a tolerance 100x below that still catches any mix.
SAME_SNAPSHOT_TOLERANCE = 1e-4
NETWORK_SEED = 3   # the network fixture's (tests/unit/conftest.py)


def _load(rig: Rig, swaps: int, wanted: int, clients: int = 2, seed: int = 0) -> list[tuple[dict, dict]]:
    """(request, answer) pairs gathered while at least ``swaps`` evaluations swap checkpoints in, until
    ``wanted`` answers came back."""
    stop = threading.Event()
    answers: list[tuple[dict, dict]] = []
    lock = threading.Lock()

    def client(index: int) -> None:
        rng = random.Random(seed * 100 + index)
        with httpx.Client(base_url=rig.url, timeout=120) as http:
            while not stop.is_set():
                prompt = "".join(rng.choice("abcdefgh ij\n(){}=") for _ in range(rng.randint(2, 40)))
                model = f"unit@{rng.choice(STEPS)}" if rng.random() < 0.6 else "unit@latest"
                generate = rng.random() < 0.3
                request = {"model": model, "prompt": prompt, "max_tokens": 3 if generate else 0, "echo": True,
                           "logprobs": 1, "temperature": 0}
                response = http.post("/v1/completions", json=request)
                if response.status_code == 200:
                    with lock:
                        answers.append((request, response.json()))

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    order = random.Random(seed)
    try:
        deadline = time.monotonic() + 600
        done = 0
        while (done < swaps or len(answers) < wanted) and time.monotonic() < deadline:
            rig.swap(order.choice(STEPS))          # an evaluation starts: its checkpoint goes in
            done += 1
            ran = rig.serve(may_swap=False, budget_s=0.005)   # between its batches: requests, never a swap
            ran += rig.serve(may_swap=True, budget_s=0.005)   # between evaluations: pinned steps may swap in
            if not ran:
                rig.woken.wait(0.005)
                rig.woken.clear()   # between evaluations: pinned steps may swap in
    finally:
        stop.set()
        deadline = time.monotonic() + 120
        while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
            rig.serve(may_swap=True)   # the requests in flight get their answers
            rig.woken.wait(0.005)
            rig.woken.clear()
    return answers


def _mismatches(rig: Rig, answers: list[tuple[dict, dict]], sample: int) -> list[str]:
    """Answers whose log-probabilities are not those of the snapshot they name (recomputed directly)."""
    wrong = []
    chosen = random.Random(1).sample(answers, min(sample, len(answers)))
    by_step: dict[int, list[tuple[dict, dict]]] = {}
    for request, answer in chosen:
        by_step.setdefault(answer["evald"]["step"], []).append((request, answer))
    for step, pairs in by_step.items():
        rig.swap(step)
        for request, answer in pairs:
            if answer["evald"]["snapshot"] != rig.digests[step]:
                wrong.append(f"step {step}: digest {answer['evald']['snapshot'][:12]} is not the snapshot's")
            pinned = request["model"].split("@")[1]
            if pinned != "latest" and int(pinned) != step:
                wrong.append(f"asked for {request['model']}, answered by step {step}")
            served = answer["choices"][0]["logprobs"]["token_logprobs"]
            # The prompt is bytes; generated tokens are checked too when each decodes to one ASCII character
            # (then its id is known), since each generated token came from a forward pass of its own.
            shown = answer["choices"][0]["logprobs"]["tokens"]
            whole = list(request["prompt"].encode())
            if all(len(t) == 1 and ord(t) < 128 for t in shown):
                whole = [ord(t) for t in shown]
            [scores] = rig.scorer.score([ScoreRequest(whole[:1], whole[1:])])
            recomputed = [float(v) for v in scores.logprobs]
            worst = max((abs(a - b) for a, b in zip(served[1:len(whole)], recomputed)), default=0.0)
            if len(served[1:len(whole)]) != len(recomputed) or worst > SAME_SNAPSHOT_TOLERANCE:
                wrong.append(f"step {step}: log-probabilities of {request['prompt']!r} ({request['max_tokens']} "
                             f"generated, {len(served) - 1} served vs {len(recomputed)} recomputed) differ from the "
                             f"snapshot's by up to {worst:.3g}")
    return wrong


@pytest.fixture(scope="module")
def rig(network):
    r = Rig(network, ServeOptions(listen="127.0.0.1:0", batch_size=4, queue_size=32),
            {step: snapshot(network, step) for step in STEPS})
    yield r
    r.close()


def test_no_answer_under_200_swaps_comes_from_another_or_a_mixed_snapshot(rig):
    before = rig.swaps
    answers = _load(rig, swaps=200, wanted=60)
    assert rig.swaps - before >= 200
    assert len(answers) >= 60, f"only {len(answers)} answers"
    steps = {a["evald"]["step"] for _, a in answers}
    assert len(steps) >= 3, f"answers came from steps {steps} only"
    assert _mismatches(rig, answers, sample=60) == []


@pytest.mark.slow
def test_no_answer_under_2000_swaps_comes_from_another_or_a_mixed_snapshot(rig):
    answers = _load(rig, swaps=2000, wanted=600, clients=4, seed=7)
    assert _mismatches(rig, answers, sample=400) == []


def test_the_check_catches_an_answer_from_weights_other_than_the_ones_it_names(rig):
    """A swap that names the wrong step (the bug class of stale reloads) is found by the same check."""
    honest = rig.swap

    def lying_swap(step: int) -> Held:
        held = honest(step)
        other = STEPS[(STEPS.index(step) + 1) % len(STEPS)]
        rig._held = Held(other, rig.digests[other], held.path)   # claims another snapshot
        return rig._held

    rig.runner._swap = rig.swap = lying_swap
    try:
        answers = _load(rig, swaps=20, wanted=30)
    finally:
        rig.runner._swap = rig.swap = honest
    assert answers and _mismatches(rig, answers, sample=30) != []


def test_snapshots_differ_far_beyond_the_tolerance(rig):
    """What the tolerance above rests on: one prompt's values under two snapshots differ by > 100x of it."""
    prompt = list(b"def main():\n    return 0\n")
    values = []
    for step in STEPS[:2]:
        rig.swap(step)
        [scores] = rig.scorer.score([ScoreRequest(prompt[:1], prompt[1:])])
        values.append(scores.logprobs)
    assert max(abs(a - b) for a, b in zip(*values)) > 100 * SAME_SNAPSHOT_TOLERANCE
