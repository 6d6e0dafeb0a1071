"""What serving costs: echo log-prob requests over HTTP vs the same forward passes in process, and how much
a steady request load slows evaluations (commit-to-point time), side by side.

    .venv/bin/python -m bench.serve [--requests 400] [--clients 4] [--prompts 1,8] [--reps 5]
    .venv/bin/python -m bench.serve --decode-only [--new-tokens 256] [--decode-rows 1,8] [--reps 3]

Part 1, in one process (the demo GPT, seq_len 64, the real TokenScorer, Runner, Starlette app and
uvicorn thread; a thread plays evald's main loop): ``--requests`` echo requests (``max_tokens: 0``,
``logprobs: 1``; 63-byte prompts, ``--prompts`` of them per request) from ``--clients`` concurrent
httpx clients, and the same completions run one after another in process through
``evald.serve.engine.run`` (the same scorer, no HTTP, no queue), the two arms alternated ``--reps``
times. Reported: requests/s and prompt tokens/s of each (medians), the median ratio and its range, and
the forward passes each arm ran (over HTTP, requests waiting together share passes).

Part 0, generation (``--decode-only`` runs just this): ``--decode-rows`` completions of ``--new-tokens`` tokens
(63-byte prompts, one request of that many prompts) on the demo GPT with a window of 512, in process through
``evald.serve.engine.run``, once on the cached decoder (the network's ``init_cache``/``extend``) and once on
the full-forward fallback (the same weights behind a Cell without them), the two arms alternated
``--reps`` times, greedy and seeded sampling. Reported: generated tokens/s of each (medians), the
speed-up, the forward passes and graphs each ran, and whether both gave the same tokens.

Part 2, real processes: a tiny training run (60 steps, a snapshot every 10, a sleep per step so that
evald is idle between checkpoints) with ``evald --serve`` beside it, once with no client and once
with ``--clients`` clients sending echo requests all the time. Reported: the median time from each
checkpoint's commit to the end of its evaluation (the ledger's commit_time and finished_at), and the
longest stretch served between two evaluation batches (``serve/longest_between_batches_s``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + f"[:63]


def part1(requests: int, clients: int, prompts: int, reps: int) -> dict:
    import httpx
    import mindspore as ms

    from evald.config import ServeOptions
    from evald.pipeline.network import Held
    from evald.pipeline.engine import TokenScorer
    from evald.pipeline.suites.tokenizer import ByteTokenizer
    from evald.serve import engine
    from evald.serve.app import Context, build_app
    from evald.serve.http_thread import HttpThread
    from evald.serve.jobs import JobQueue, ServeStats
    from evald.serve.requests import Completion, ModelRef
    from evald.serve.schedule import Runner
    from examples.tiny_lm.model import build_model

    ms.set_context(mode=ms.GRAPH_MODE)
    net = build_model(seq_len=64, seed=3)
    net.set_train(False)
    options = ServeOptions(listen="127.0.0.1:0", batch_size=8, queue_size=256)
    tokenizer = ByteTokenizer()
    scorer = TokenScorer(net, batch_size=8, top_k=options.sample_top_k)
    scorer.warm_up(generate=False)
    held = Held(1, "bench", Path("step_1"))
    woken = threading.Event()
    queue, stats = JobQueue(options.queue_size, woken.set), ServeStats()
    runner = Runner(queue, stats, run="bench", tokenizer=tokenizer, scorer=lambda: scorer, held=lambda: held,
                    swap=lambda step: held, servable=lambda: (1,))
    http = HttpThread(build_app(Context(options, tokenizer, queue, stats, runner, window=64)), "127.0.0.1", 0,
                      keep_alive_s=5, limit_concurrency=256, header_timeout_s=10)
    http.start()
    stop = threading.Event()

    def main_loop() -> None:
        while not stop.is_set():
            if not runner.run(options.budget_s, may_swap=True):
                woken.wait(0.005)
                woken.clear()

    loop = threading.Thread(target=main_loop, daemon=True)
    loop.start()
    body = {"model": "bench@latest", "prompt": [PROMPT] * prompts, "max_tokens": 0, "echo": True, "logprobs": 1,
            "temperature": 0}
    completion = Completion(ModelRef("bench", None), tuple(tuple(tokenizer.encode(PROMPT)) for _ in range(prompts)),
                            max_tokens=0, temperature=0.0, top_p=1.0, n=1, stop=(), seed=None, logprobs=1, echo=True)
    per_client = requests // clients // reps
    n = per_client * clients

    def client() -> None:
        with httpx.Client(base_url=http.url, timeout=120) as c:
            for _ in range(per_client):
                assert c.post("/v1/completions", json=body).status_code == 200

    def http_arm() -> tuple[float, int]:
        passes, started = scorer.stats.forward_passes, time.perf_counter()
        threads = [threading.Thread(target=client) for _ in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return time.perf_counter() - started, scorer.stats.forward_passes - passes

    def local_arm() -> tuple[float, int]:
        passes, started = scorer.stats.forward_passes, time.perf_counter()
        for _ in range(n):
            engine.run(scorer, tokenizer, completion)
        return time.perf_counter() - started, scorer.stats.forward_passes - passes

    with httpx.Client(base_url=http.url, timeout=120) as c:   # warm the path once
        c.post("/v1/completions", json=body)
    arms = []
    for _ in range(reps):   # alternated, so that a shared machine's drift hits both arms alike
        arms.append((http_arm(), local_arm()))
    stop.set()
    loop.join()
    http.stop()
    tokens = n * prompts * len(PROMPT)
    http_s = statistics.median(h[0] for h, _ in arms)
    local_s = statistics.median(local[0] for _, local in arms)
    return {"prompts_per_request": prompts, "requests_per_rep": n, "reps": reps,
            "http_requests_per_s": n / http_s, "http_tokens_per_s": tokens / http_s,
            "in_process_requests_per_s": n / local_s, "in_process_tokens_per_s": tokens / local_s,
            "ratio_http_to_in_process_median": statistics.median(local[0] / h[0] for h, local in arms),
            "ratio_range": [min(local[0] / h[0] for h, local in arms), max(local[0] / h[0] for h, local in arms)],
            "forward_passes_per_rep_http": statistics.median(h[1] for h, _ in arms),
            "forward_passes_per_rep_in_process": arms[0][1][1]}


def part0(new_tokens: int, rows: int, reps: int) -> dict:
    """Cached vs full-forward serving of ``rows`` completions of ``new_tokens`` tokens, side by side."""
    import mindspore as ms

    from evald.pipeline.engine import TokenScorer
    from evald.pipeline.suites.tokenizer import ByteTokenizer
    from evald.serve import engine
    from evald.serve.requests import Completion, ModelRef
    from examples.tiny_lm.model import build_model
    from tests.networks import without_cached_decoding

    ms.set_context(mode=ms.GRAPH_MODE)
    window = 512
    net = build_model(seq_len=window, seed=3)
    net.set_train(False)
    tokenizer = ByteTokenizer()
    scorers = {}
    for name, network in (("cached", net), ("full_forward", without_cached_decoding(net))):
        started = time.perf_counter()
        scorer = TokenScorer(network, batch_size=8, top_k=40)   # serve.batch_size and sample_top_k's defaults
        scorer.warm_up(generate=False, top_decoding=True)
        scorers[name] = (scorer, time.perf_counter() - started)
    assert scorers["cached"][0].decoding == "cached" and scorers["full_forward"][0].decoding == "full-forward"
    prompts = tuple(tuple(tokenizer.encode(f"{i:02d}" + PROMPT[2:])) for i in range(rows))
    out: dict = {"window": window, "rows": rows, "new_tokens": new_tokens, "reps": reps}
    for mode, temperature, seed in (("greedy", 0.0, None), ("sampled", 0.8, 7)):
        completion = Completion(ModelRef("bench", None), prompts, max_tokens=new_tokens, temperature=temperature,
                                top_p=0.95, n=1, stop=(), seed=seed, logprobs=1, echo=False)
        times: dict[str, list[float]] = {name: [] for name in scorers}
        made: dict[str, list] = {}
        passes: dict[str, int] = {}
        for _ in range(reps):   # alternated, so that a shared machine's drift hits both arms alike
            for name, (scorer, _) in scorers.items():
                before, started = scorer.stats.forward_passes, time.perf_counter()
                choices = engine.run(scorer, tokenizer, completion)
                times[name].append(time.perf_counter() - started)
                passes[name] = scorer.stats.forward_passes - before
                made[name] = [c.tokens for c in choices]
        tokens = sum(len(t) for t in made["cached"])
        for name in scorers:
            out[f"{mode}_{name}_tokens_per_s"] = tokens / statistics.median(times[name])
            out[f"{mode}_{name}_forward_passes"] = passes[name]
        out[f"{mode}_tokens"] = tokens
        out[f"{mode}_speedup_median"] = statistics.median(f / c for f, c in zip(times["full_forward"], times["cached"]))
        out[f"{mode}_same_tokens"] = made["cached"] == made["full_forward"]
    for name, (scorer, warm_s) in scorers.items():
        out[f"{name}_graphs"], out[f"{name}_warm_up_s"] = scorer.compiled_graphs, round(warm_s, 1)
    return out


def _commit_to_point(logdir: Path) -> tuple[list[float], float | None]:
    sys.path.insert(0, str(REPO))
    from evald.cli.status import ReadOnlyLedger

    run = next(logdir.glob("*/ledger.sqlite")).parent
    ledger = ReadOnlyLedger(run / "ledger.sqlite")
    try:
        times = ledger.times()
        serve = ledger.get_state("serve") or {}
    finally:
        ledger.close()
    return ([finished - commit for commit, _, finished in times.values() if finished and commit],
            serve.get("longest_between_batches_s"))


def part2(clients: int, loaded: bool) -> dict:
    import httpx

    tmp = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    sock = Path(tempfile.mkdtemp(prefix="bs"))
    env = dict(os.environ, GLOG_v="3", PYTHONPATH=str(REPO), EVALD_ENDPOINT=f"ipc://{sock}/n.sock",
               EVALD_CONTROL_ENDPOINT=f"ipc://{sock}/c.sock", EVALD_SOCKET_DIR=str(sock))
    evald = subprocess.Popen([sys.executable, "-m", "evald", "--lag-policy", "all", "--subset-size", "64",
                              "--batch-size", "16", "--generation", '{"prompts": 0}', "--cpu-affinity", "1",
                              "--serve", '{"listen": "127.0.0.1:0", "report_every_s": 1}', "--logdir",
                              str(tmp / "tb")], env=env, cwd=REPO, stdout=open(tmp / "evald.log", "wb"),
                             stderr=subprocess.STDOUT)
    trainer = subprocess.Popen([sys.executable, "-m", "examples.tiny_lm.train", "--ckpt-dir", str(tmp / "ckpt"),
                                "--steps", "60", "--every", "10", "--loop", "custom", "--cpu", "0",
                                "--step-sleep", "0.2"], env=env, cwd=REPO, stdout=open(tmp / "trainer.log", "wb"),
                               stderr=subprocess.STDOUT)
    stop, served = threading.Event(), [0]

    def client() -> None:
        while not stop.is_set() and not list((tmp / "tb").glob("*/serve.json")):
            time.sleep(0.1)
        if stop.is_set():
            return
        url = json.loads(next((tmp / "tb").glob("*/serve.json")).read_text())["url"]
        body = {"prompt": PROMPT, "max_tokens": 0, "echo": True, "logprobs": 1, "temperature": 0}
        with httpx.Client(base_url=url, timeout=120) as c:
            while not stop.is_set():
                try:
                    if c.post("/v1/completions", json=body).status_code == 200:
                        served[0] += 1
                except httpx.HTTPError:
                    time.sleep(0.1)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients if loaded else 0)]
    for t in threads:
        t.start()
    try:
        trainer.wait(900)
        evald.wait(300)   # the run ends: evald exits once every checkpoint is evaluated
    finally:
        stop.set()
        for t in threads:
            t.join(60)
        for p in (trainer, evald):
            if p.poll() is None:
                p.kill()
    delays, longest = _commit_to_point(tmp / "tb")
    return {"load": f"{clients} clients" if loaded else "none", "checkpoints": len(delays),
            "commit_to_point_s_median": statistics.median(delays), "commit_to_point_s_max": max(delays),
            "requests_served": served[0], "longest_between_batches_s": longest, "dir": str(tmp)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--prompts", default="1,8", help="prompts per request (comma-separated runs)")
    parser.add_argument("--reps", type=int, default=5, help="alternated repetitions of the two arms of part 1")
    parser.add_argument("--skip-e2e", action="store_true", help="parts 0 and 1 only")
    parser.add_argument("--decode-only", action="store_true", help="part 0 only: cached vs full-forward generation")
    parser.add_argument("--new-tokens", type=int, default=256, help="part 0: tokens generated per completion")
    parser.add_argument("--decode-rows", default="1,8", help="part 0: completions per request (comma-separated runs)")
    args = parser.parse_args()
    for rows in (int(r) for r in args.decode_rows.split(",")):
        print(json.dumps(part0(args.new_tokens, rows, args.reps)), flush=True)
    if args.decode_only:
        return 0
    for prompts in (int(p) for p in args.prompts.split(",")):
        print(json.dumps(part1(args.requests, args.clients, prompts, args.reps)), flush=True)
    if not args.skip_e2e:
        for loaded in (False, True, False, True):
            print(json.dumps(part2(args.clients, loaded)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
