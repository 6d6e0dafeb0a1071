"""The demo's two benchmark suites, built offline from standard-library sources it never trained on.

``write_benchmarks(directory)`` writes lm-eval task YAMLs and their JSONL data under ``directory``
and returns it (the suites' ``include_path``):

* ``stdlib_next_line``: multiple choice, "which of four lines really follows this one". Each
  document is a line of a held-out module (its last bytes, so context and choice fit the demo's
  64-byte window) with the line that follows it and three lines drawn from elsewhere in the same
  module, in a seeded order. Metrics: ``acc`` and ``acc_norm``.
* ``stdlib_bpb``: a tag over ``bpb_<package>`` tasks, one per held-out standard-library package,
  each a ``loglikelihood_rolling`` task whose documents are chunks of that package's sources.
  Metrics: ``bits_per_byte``, ``byte_perplexity``, ``word_perplexity``.

Everything is a function of the Python installation and the arguments, so every machine with the
same Python gets the same documents (their hash is part of each suite's identity anyway).
No module or package here is in examples.tiny_lm.data's training corpus.
"""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import numpy as np

NEXT_LINE_MODULES = (
    "heapq.py", "bisect.py", "csv.py", "calendar.py", "difflib.py", "fractions.py", "glob.py", "gzip.py",
    "hashlib.py", "hmac.py", "locale.py", "mailbox.py", "optparse.py", "pprint.py", "sched.py", "shlex.py",
    "smtplib.py", "socket.py", "statistics.py", "tempfile.py", "timeit.py", "tokenize.py", "traceback.py",
    "uuid.py", "weakref.py",
)
BPB_PACKAGES = ("email", "http", "xml", "unittest", "asyncio", "concurrent", "importlib", "urllib", "ctypes",
                "html", "multiprocessing", "xmlrpc", "wsgiref")
CONTEXT_BYTES, CHOICE_BYTES = 36, 24


def _stdlib() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _clip(text: str, limit: int, keep_end: bool) -> str:
    data = text.encode("utf-8")
    data = data[-limit:] if keep_end else data[:limit]
    return data.decode("utf-8", "ignore")


def next_line_docs(count: int = 240, seed: int = 0) -> list[dict]:
    """``count`` four-way documents {"context", "choices", "gold"}, seeded."""
    rng = np.random.default_rng(seed)
    candidates: list[tuple[str, str, list[str]]] = []
    for name in NEXT_LINE_MODULES:
        path = _stdlib() / name
        if not path.exists():
            continue
        lines = [ln.rstrip() for ln in path.read_text("utf-8", "replace").splitlines()]
        lines = [ln for ln in lines if len(ln.strip()) >= 12]
        for i in range(len(lines) - 1):
            candidates.append((lines[i], lines[i + 1], lines))
    if len(candidates) < count:
        raise ValueError(f"only {len(candidates)} candidate lines in the standard library, {count} wanted")
    docs = []
    for pick in rng.choice(len(candidates), size=count, replace=False):
        line, following, pool = candidates[int(pick)]
        truth = _clip(following, CHOICE_BYTES, keep_end=False)
        distractors: list[str] = []
        while len(distractors) < 3:
            other = _clip(pool[int(rng.integers(len(pool)))], CHOICE_BYTES, keep_end=False)
            if other != truth and other not in distractors:
                distractors.append(other)
        gold = int(rng.integers(4))
        choices = distractors[:gold] + [truth] + distractors[gold:]
        docs.append({"context": _clip(line, CONTEXT_BYTES, keep_end=True) + "\n", "choices": choices, "gold": gold})
    return docs


def bpb_docs(package: str, docs: int = 6, chunk_bytes: int = 320) -> list[dict]:
    """The first ``docs`` chunks of ``package``'s sources (tests excluded), as {"text"}."""
    files = sorted(p for p in (_stdlib() / package).rglob("*.py") if "test" not in p.parts)
    text = "\n".join(p.read_text("utf-8", "replace") for p in files[:4]).encode("utf-8")
    return [{"text": text[i * chunk_bytes:(i + 1) * chunk_bytes].decode("utf-8", "ignore")} for i in range(docs)]


def _task_yaml(task: str, data_file: Path, body: str) -> str:
    return (f"task: {task}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {json.dumps(str(data_file))}\n"
            f"test_split: test\n{body}metadata:\n  version: 1.0\n")


def _write_jsonl(path: Path, docs: list[dict]) -> None:
    path.write_text("".join(json.dumps(d) + "\n" for d in docs))


def write_benchmarks(directory: str | Path, next_line_count: int = 240, bpb_docs_per_set: int = 6) -> str:
    """Write both suites' task YAMLs and data under ``directory``; returns it, the include path."""
    root = Path(directory)
    data = root / "data"
    data.mkdir(parents=True, exist_ok=True)
    _write_jsonl(data / "stdlib_next_line.jsonl", next_line_docs(next_line_count))
    (root / "stdlib_next_line.yaml").write_text(_task_yaml(
        "stdlib_next_line", data / "stdlib_next_line.jsonl",
        "output_type: multiple_choice\ndoc_to_text: \"{{context}}\"\ndoc_to_choice: \"{{choices}}\"\n"
        "doc_to_target: \"{{gold}}\"\ntarget_delimiter: \"\"\nmetric_list:\n  - metric: acc\n"
        "    aggregation: mean\n    higher_is_better: true\n  - metric: acc_norm\n    aggregation: mean\n"
        "    higher_is_better: true\n"))
    for package in BPB_PACKAGES:
        if not (_stdlib() / package).is_dir():
            continue
        _write_jsonl(data / f"bpb_{package}.jsonl", bpb_docs(package, bpb_docs_per_set))
        (root / f"bpb_{package}.yaml").write_text(_task_yaml(
            f"bpb_{package}", data / f"bpb_{package}.jsonl",
            "tag:\n  - stdlib_bpb\noutput_type: loglikelihood_rolling\ndoc_to_text: \"\"\n"
            "doc_to_target: \"{{text}}\"\nmetric_list:\n"  # each with its aggregation: lm-eval warns otherwise
            "  - metric: word_perplexity\n    aggregation: weighted_perplexity\n    higher_is_better: false\n"
            "  - metric: byte_perplexity\n    aggregation: weighted_perplexity\n    higher_is_better: false\n"
            "  - metric: bits_per_byte\n    aggregation: bits_per_byte\n    higher_is_better: false\n"))
    return str(root)


def build_tokenizer():
    """The demo's tokenizer factory (``examples.tiny_lm.benchmarks:build_tokenizer``): bytes are tokens."""
    from evald.pipeline.suites.tokenizer import ByteTokenizer

    return ByteTokenizer()
