"""Benchmark suites: lm-evaluation-harness tasks on the compiled network, each suite with an identity.

A ``SuiteRunner`` is built once per suite (``[suites.NAME]``, evald.config.options.SuiteOptions)
beside the validation Evaluator, on the same network: it loads the suite's tasks through lm-eval's
``TaskManager(include_path=...)``, draws each task's fixed, seeded subset of documents (passed to
lm-eval as ``samples=`` doc indices, so every checkpoint sees the same documents; evald and lm-eval read
them by index, ``documents_by_index``, never the whole dataset), computes the
suite's identity, and compiles its TokenScorer's buckets. ``run()`` then scores the weights the
network holds now through ``lm_eval.simple_evaluate(model=EvaldLM, ..., log_samples=True)``.

The identity (``identity``, hashed to ``identity_sha256``) is everything that makes two results
comparable: the lm-eval version; each task's name, the sha256 of its resolved config (lm-eval's
``dump_config``, functions by name) and of its selected documents; ``num_fewshot``; the subset's
seed and size; the tokenizer's hash (evald.pipeline.suites.tokenizer); the scorer's max_length; the
prefix token of rolling windows and empty contexts (it changes bits_per_byte). The
ledger keys a suite's cells on ``cell_identity``: the suite identity's hash followed by a hash of
the validation's network identity (model factory and kwargs), so another model configuration makes
new cells too, while two runs' per-sample files stay comparable on the suite identity alone; and
its first 12 characters, which is what status, compare, the log and the file names show, are the
suite identity's.

Numbers you can trust: a document whose log-likelihood is not finite (weights that give NaN or Inf)
makes ``run()`` raise NonFiniteScores, naming each task and how many of its documents, so the cell
fails with that reason; lm-eval would otherwise take the argmax over NaN (choice 0) and report a
plain accuracy. The per-sample records are checked, and the adapter's own count of non-finite
scores backs them (a task whose records drop its responses is caught as well).

May import: config, contracts, the pipeline's engine, and its tokenizer, lm_adapter, subset, task_files modules.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import time
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

import numpy as np

from evald.config.options import SuiteOptions
from evald.pipeline.engine import TokenScorer
from evald.pipeline.suites.task_files import task_manager
from evald.pipeline.subset import select_subset
from evald.pipeline.suites.tokenizer import Tokenizer, tokenizer_hash

log = logging.getLogger("evald.pipeline.suites.runner")

MAX_NAMED = 8              # tasks named in one NonFiniteScores reason
SAMPLE_TEXT_LIMIT = 4096   # characters of a target or generated response kept per document
HASH_KEYS = ("doc_hash", "prompt_hash", "target_hash")
_SKIPPED_RESULT_KEYS = {"name", "alias", "sample_len", " ", "samples"}


def _sha256(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":"), default=_plain).encode()).hexdigest()


def config_sha256(task: Any) -> str:
    """The sha256 of an lm-eval task's resolved config, as a suite's identity records it."""
    return _sha256(task.dump_config())


def _plain(value: Any) -> Any:
    """JSON for what lm-eval configs hold besides JSON: functions by name, never by address."""
    if callable(value):
        return f"{getattr(value, '__module__', '?')}.{getattr(value, '__qualname__', type(value).__name__)}"
    return str(value)


class NonFiniteScores(ValueError):
    """The weights gave log-likelihoods that are not finite: the suite's cell fails with this reason."""

    def __init__(self, suite: str, documents: Mapping[str, tuple[int, int]], scores: int) -> None:
        self.suite, self.documents, self.scores = suite, dict(documents), scores
        named = sorted(documents.items())
        where = "; ".join(f"{bad} of {total} documents of task {task}" for task, (bad, total) in named[:MAX_NAMED])
        where += f"; and {len(named) - MAX_NAMED} more task(s)" if len(named) > MAX_NAMED else ""
        super().__init__(
            f"suite {suite}: log-likelihoods that are not finite (NaN or Inf) on "
            f"{where or f'{scores} scored request(s)'}: the weights give non-finite scores, so no accuracy is "
            f"recorded (lm-eval would pick the first choice of each such document); check the checkpoint's weights")


@dataclass(frozen=True)
class TaskResult:
    name: str
    metrics: dict[str, float]          # lm-eval's aggregate: "acc", "acc_stderr", ... (filter "none" dropped)
    samples: list[dict]                # one per document: doc_id, target, resps, metrics
    documents: int


@dataclass(frozen=True)
class SuiteResult:
    suite: str
    identity: dict[str, Any]
    identity_sha256: str
    tasks: dict[str, TaskResult]
    evaluate_s: float
    compiled_graphs: int
    tokens: int                        # real tokens run through the network for this result

    def scalars(self) -> dict[str, float]:
        """TensorBoard's SUITE/TASK/METRIC (with METRIC_stderr) values."""
        return {f"{self.suite}/{task}/{metric}": value for task, result in self.tasks.items()
                for metric, value in result.metrics.items()}


class SuiteRunner:
    def __init__(self, name: str, options: SuiteOptions, network: Any, tokenizer: Tokenizer, *,
                 network_identity: Mapping[str, Any] | None = None, scorer: Any = None) -> None:
        os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # tasks and data are local: never download
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import lm_eval

        from evald.pipeline.suites.lm_adapter import EvaldLM

        quiet_lm_eval_git()
        started = time.time()
        self.name, self.options = name, options
        self.lm_eval_version = getattr(lm_eval, "__version__", "unknown")
        self.task_manager = task_manager(tuple(options.include_path), tuple(options.tasks))
        loaded = self.task_manager.load(list(options.tasks))["tasks"]
        if not loaded:
            raise ValueError(f"suite {name}: lm-eval found no task for {list(options.tasks)} (include_path "
                             f"{list(options.include_path)})")
        self.scorer = scorer or TokenScorer(network, max_length=options.max_length, batch_size=options.batch_size)
        self.lm = EvaldLM(self.scorer, tokenizer, max_gen_toks=options.max_gen_toks,
                          prefix_token=options.prefix_token)
        self.documents: dict[str, list[int]] = {}
        tasks: dict[str, Any] = {}
        documents_by_index()
        for task_name, task in sorted(loaded.items()):
            docs = task.eval_docs   # read by index: the chosen documents only, never the whole dataset
            count = len(docs)
            if count == 0:
                raise ValueError(f"suite {name}: task {task_name} has no evaluation documents")
            chosen = ([int(i) for i in select_subset(count, options.limit, options.seed)]
                      if options.limit and options.limit < count else list(range(count)))
            self.documents[task_name] = chosen
            tasks[task_name] = {"config_sha256": config_sha256(task),
                                "docs_sha256": _sha256([docs[i] for i in chosen]), "documents": count,
                                "output_type": task.get_config("output_type")}
        self.identity = {
            "suite": name, "lm_eval": self.lm_eval_version, "tasks": tasks, "num_fewshot": options.num_fewshot,
            "subset": {"seed": options.seed, "size": options.limit}, "tokenizer": tokenizer_hash(tokenizer),
            "max_length": self.scorer.max_length, "max_gen_toks": options.max_gen_toks,
            "prefix_token": self.lm.prefix_token_id}
        self.identity_sha256 = _sha256(self.identity)
        self.network_identity = dict(network_identity or {})
        # The suite identity, then the network's hash: every place that shows an identity's first 12
        # characters (status, compare, the log, file names, TensorBoard) shows the suite's.
        self.cell_identity = f"{self.identity_sha256}.{_sha256({'network': self.network_identity})[:16]}"
        self._started, self._ready = started, False
        with self._naming_empty_documents():
            samples = self._plan_buckets()
        # the graphs: compiled by warm_next, one a call, or by warm_up. Only what the tasks run: forks help
        # log-likelihood choices, generation graphs serve generate_until (a bits-per-byte suite needs neither).
        # The model's cached path is checked on the suite's own rows (evald.pipeline.engine.cache_check).
        kinds = {task["output_type"] for task in tasks.values()}
        self._warming = self.scorer.warming(generate="generate_until" in kinds,
                                            forks=bool(kinds & {"multiple_choice", "loglikelihood"}),
                                            check_rows=samples)

    def _plan_buckets(self) -> list[list[int]]:
        """A dry run of lm-eval over the suite's documents, answered with zeros (bucket_plan.PlanningScorer):
        the rows every request would run, and the scorer's bucket lengths fitted to them before any graph
        compiles (TokenScorer.fit_lengths). A bits-per-byte suite of 600-token documents in a 1,280 window
        then runs them in a 608 bucket, not the ladder's 704. The tokens of the suite's first few requests."""
        from evald.pipeline.suites.bucket_plan import PlanningScorer
        from evald.pipeline.suites.lm_adapter import EvaldLM

        started = time.time()
        planner = PlanningScorer(self.scorer)
        self._evaluate(EvaldLM(planner, self.lm.evald_tokenizer, max_gen_toks=self.options.max_gen_toks,
                               prefix_token=self.options.prefix_token), log_samples=False, bootstrap_iters=0)
        lengths = self.scorer.fit_lengths(planner.rows)
        log.info("suite %s: %d rows planned in %.1fs; buckets %s", self.name, len(planner.rows),
                 time.time() - started, list(lengths))
        return planner.samples

    def _evaluate(self, lm: Any, *, log_samples: bool, bootstrap_iters: int) -> dict:
        """lm-eval's evaluation of the suite's documents with ``lm``, seeded as the suite says."""
        import lm_eval

        seed = self.options.seed
        return lm_eval.simple_evaluate(
            model=lm, tasks=list(self.options.tasks), num_fewshot=self.options.num_fewshot,
            samples={t: list(d) for t, d in self.documents.items()}, log_samples=log_samples,
            task_manager=self.task_manager, bootstrap_iters=bootstrap_iters, random_seed=seed,
            numpy_random_seed=seed, fewshot_random_seed=seed)

    @contextlib.contextmanager
    def _naming_empty_documents(self) -> Iterator[None]:
        """An EmptyDocument from the adapter as a ValueError naming the task and the document's index in it
        (lm-eval numbers the selected documents 0, 1, ...; ``documents`` maps them back)."""
        from evald.pipeline.suites.lm_adapter import EmptyDocument

        try:
            yield
        except EmptyDocument as exc:
            chosen = self.documents.get(str(exc.task), [])
            where = f"task {exc.task}"
            if exc.document is not None:
                index = chosen[exc.document] if 0 <= exc.document < len(chosen) else exc.document
                where += f", document {index} (of its {self.identity['tasks'].get(exc.task, {}).get('documents', '?')})"
            raise ValueError(f"{where}: {exc.what}; fix or drop that document (e.g. a process_docs that leaves it "
                             f"out) and start evald again") from None

    def warm_next(self) -> bool:
        """Compile the next of the suite's graphs (seconds each, so evald can validate a checkpoint between two
        of them); True once every graph is compiled and the suite is ready."""
        if not self._ready and next(self._warming, None) is None:
            self._ready = True
            log.info("suite %s ready in %.1fs: %d task(s), %d document(s), identity %s, %d graph(s) compiled",
                     self.name, time.time() - self._started, len(self.documents),
                     sum(len(d) for d in self.documents.values()), self.identity_sha256[:12],
                     self.scorer.compiled_graphs)
        return self._ready

    def warm_up(self) -> None:
        """Compile every graph the suite still needs, now."""
        while not self.warm_next():
            pass

    def run(self) -> SuiteResult:
        """Evaluate the weights the network holds now (every graph compiled first: none while scoring)."""
        self.warm_up()

        started, before = time.time(), self.scorer.stats.real_tokens
        nonfinite_before = self.lm.counts.nonfinite
        with self._naming_empty_documents():
            out = self._evaluate(self.lm, log_samples=True, bootstrap_iters=1000)
        tasks = {}
        broken: dict[str, tuple[int, int]] = {}
        for task_name in self.documents:
            metrics = _aggregates(out["results"].get(task_name, {}))
            raw = sorted(out["samples"].get(task_name, []), key=lambda s: int(s["doc_id"]))
            bad = sum(1 for s in raw if _not_finite(s.get("resps")) or _not_finite(s.get("filtered_resps")))
            if bad:
                broken[task_name] = (bad, len(raw))
            samples = [sample_record(s) for s in raw]
            tasks[task_name] = TaskResult(task_name, metrics, samples, len(samples))
        nonfinite = self.lm.counts.nonfinite - nonfinite_before
        if broken or nonfinite:
            raise NonFiniteScores(self.name, broken, nonfinite)
        return SuiteResult(self.name, self.identity, self.identity_sha256, tasks, time.time() - started,
                           self.scorer.compiled_graphs, self.scorer.stats.real_tokens - before)


def documents_by_index() -> None:
    """lm-eval's ``samples=`` path walks every document of a task and tests each index against the list of
    samples (``i in samples``): O(documents x samples) at each evaluation, 10**8 documents walked for a
    limit of 4. It yields the chosen documents in index order, numbered 0, 1, ... (mapped back through the
    sorted samples by its evaluator). This reads the same documents by index, in the same order and with
    the same numbers, so a suite's evaluation reads in proportion to its limit; anything else (no samples,
    a sample out of range, documents without indexing) takes lm-eval's own path. Installed once."""
    from lm_eval import utils
    from lm_eval.api.task import Task

    walking = Task.doc_iterator
    if getattr(walking, "evald_by_index", False):
        return

    def doc_iterator(self: Any, *, rank: int = 0, limit: int | None = None, world_size: int = 1,
                     samples: list[int] | None = None) -> Any:
        docs = self.eval_docs if samples else None
        if not samples or not hasattr(docs, "__getitem__"):
            return walking(self, rank=rank, limit=limit, world_size=world_size, samples=samples)
        chosen = sorted({int(i) for i in samples})
        if chosen[0] < 0 or chosen[-1] >= len(docs):
            return walking(self, rank=rank, limit=limit, world_size=world_size, samples=samples)
        return utils.create_iterator(enumerate(docs[i] for i in chosen), rank=int(rank), limit=None,
                                     world_size=int(world_size))

    doc_iterator.evald_by_index = True  # type: ignore[attr-defined]
    Task.doc_iterator = doc_iterator


def quiet_lm_eval_git() -> None:
    """lm-eval records the git commit of the current directory at every evaluation (``git describe
    --always``), letting git print "fatal: not a git repository" to evald's log outside a checkout.
    Its own answer, asked with git's stderr closed; the same fallback (reading .git) when git fails."""
    import subprocess

    import lm_eval.evaluator
    from lm_eval.loggers.utils import get_commit_from_path

    def get_git_commit_hash() -> str | None:
        try:
            return subprocess.check_output(["git", "describe", "--always"], stderr=subprocess.DEVNULL,
                                           timeout=10).strip().decode()
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError):
            return get_commit_from_path(os.getcwd())

    lm_eval.evaluator.get_git_commit_hash = get_git_commit_hash


def _aggregates(result: Mapping[str, Any]) -> dict[str, float]:
    """lm-eval's ``"acc,none"`` / ``"acc_stderr,none"`` as ``acc`` / ``acc_stderr`` (another filter:
    ``acc@filter``); "N/A" and non-numbers left out."""
    metrics = {}
    for key, value in result.items():
        if key in _SKIPPED_RESULT_KEYS or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        metric, _, filt = key.partition(",")
        metrics[metric if filt in ("", "none") else f"{metric}@{filt}"] = float(value)
    return metrics


def sample_record(sample: Mapping[str, Any]) -> dict:
    """One document's lm-eval sample as evald keeps it: doc_id, target, resps, metrics."""
    resps = _jsonable(sample.get("filtered_resps", sample.get("resps")))
    record = {"doc_id": int(sample["doc_id"]), "target": str(sample.get("target"))[:SAMPLE_TEXT_LIMIT], "resps": resps,
              "metrics": {m: _jsonable(sample[m]) for m in sample.get("metrics", []) if m in sample}}
    for key in HASH_KEYS:   # lm-eval's own hashes of the document, prompt and target: its task_hashes (evald export)
        if isinstance(sample.get(key), str):
            record[key] = sample[key]
    return record


def _not_finite(value: Any) -> bool:
    """Whether a response (a log-likelihood, a (log-likelihood, is_greedy) pair, lists of them) holds a
    number that is not finite; texts and flags are not numbers."""
    if isinstance(value, (list, tuple)):
        return any(_not_finite(v) for v in value)
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
        return False
    try:
        return not math.isfinite(float(value))
    except (TypeError, ValueError, OverflowError):
        return False


def _jsonable(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, str):
        return value[:SAMPLE_TEXT_LIMIT]
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (int, float)):
        return value
    try:
        return float(value)
    except (TypeError, ValueError):
        return str(value)[:SAMPLE_TEXT_LIMIT]
