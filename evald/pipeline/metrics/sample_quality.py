"""Cheap quality signals for generated token sequences.

These run on raw token ids (bytes, characters or subword ids alike) so evald can
watch generation quality during training without loading a second model: a model
that starts looping shows up as a rising rep-n, a model that collapses to a few
stock phrases shows up as falling distinct-n, and a model that drifts off the
prompt shows up as falling topic consistency.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Union

import numpy as np

TokenSeq = Union[Sequence[int], np.ndarray]

__all__ = [
    "repetition_rate",
    "mean_repetition_rate",
    "distinct_n",
    "topic_consistency",
    "sample_quality_report",
]


def _as_int_list(tokens: TokenSeq) -> list[int]:
    """Normalise a token sequence to a flat list of Python ints (hashable, cheap to slice)."""
    arr = np.asarray(tokens)
    if arr.ndim != 1 and arr.size > 0:
        raise ValueError(
            f"expected a 1-D sequence of token ids, got an array of shape {arr.shape}; "
            "pass one sample at a time (or a list of samples to the *_n / mean_* functions)"
        )
    if arr.size == 0:
        return []
    if not np.issubdtype(arr.dtype, np.integer):
        if not np.all(np.isfinite(arr)) or not np.all(arr == np.round(arr)):
            raise ValueError(
                f"token ids must be integers, got dtype {arr.dtype} with non-integer values; "
                "decode model output with argmax/sampling before scoring it"
            )
        arr = arr.astype(np.int64)
    return arr.tolist()


def _check_n(n: int) -> None:
    if not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n-gram order must be an integer >= 1, got {n!r}")


def _ngrams(tokens: list[int], n: int) -> list[tuple[int, ...]]:
    """All contiguous n-grams of one sample, in order (empty when len(tokens) < n)."""
    return list(zip(*(tokens[i:] for i in range(n))))


def repetition_rate(tokens: TokenSeq, n: int) -> float:
    """rep-n of one sample: the share of its n-grams that repeat an earlier n-gram in it.

    ``rep_n = 1 - |unique n-grams| / |n-grams|``, with ``|n-grams| = len(tokens) - n + 1``.
    0.0 means no n-gram occurs twice; values near 1 mean the sample is a loop.
    Returns 0.0 when the sample has fewer than ``n`` tokens (nothing to repeat).
    """
    _check_n(n)
    grams = _ngrams(_as_int_list(tokens), int(n))
    if not grams:
        return 0.0
    return 1.0 - len(set(grams)) / len(grams)


def mean_repetition_rate(samples: Iterable[TokenSeq], n: int) -> float:
    """Mean of :func:`repetition_rate` over samples (each sample weighs the same).

    Samples shorter than ``n`` count as 0.0, as in :func:`repetition_rate`.
    Returns 0.0 for an empty list of samples.
    """
    _check_n(n)
    rates = [repetition_rate(s, n) for s in samples]
    if not rates:
        return 0.0
    return float(np.mean(rates))


def distinct_n(samples: Iterable[TokenSeq], n: int) -> float:
    """distinct-n across samples: unique n-grams over all samples / total n-grams over all samples.

    Pooled over the whole batch, so it drops both when one sample loops and when
    different samples say the same thing. Returns 0.0 when there are no n-grams.
    """
    _check_n(n)
    unique: set[tuple[int, ...]] = set()
    total = 0
    for sample in samples:
        grams = _ngrams(_as_int_list(sample), int(n))
        total += len(grams)
        unique.update(grams)
    if total == 0:
        return 0.0
    return len(unique) / total


def _bag_of_tokens(tokens: list[int], vocab_size: int, what: str) -> np.ndarray:
    if tokens and (min(tokens) < 0 or max(tokens) >= vocab_size):
        raise ValueError(
            f"{what} has token ids outside [0, {vocab_size}) (min {min(tokens)}, max {max(tokens)}); "
            "pass the model's vocab_size, or strip padding/special ids first"
        )
    return np.bincount(np.asarray(tokens, dtype=np.int64), minlength=vocab_size).astype(np.float64)


def topic_consistency(prompt: TokenSeq, continuation: TokenSeq, vocab_size: int) -> float:
    """Cosine similarity between the bag-of-tokens of the prompt and of the continuation.

    With ``p`` and ``c`` the unigram count vectors (length ``vocab_size``) of the
    prompt and the continuation, ``topic_consistency = p.c / (|p| |c|)``, in [0, 1].

    Why this definition: it needs no extra model and works the same for byte-,
    character- and token-level LMs; a continuation that keeps using the prompt's
    vocabulary scores high, one that drifts to unrelated tokens (or degenerates
    into a single repeated token) scores low. It is a drift signal to compare
    across checkpoints of one model, not an absolute measure of relevance:
    frequent tokens (spaces, 'the') dominate it at byte/char level.
    Returns 0.0 when either side is empty.
    """
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
    p_tokens = _as_int_list(prompt)
    c_tokens = _as_int_list(continuation)
    if not p_tokens or not c_tokens:
        return 0.0
    p = _bag_of_tokens(p_tokens, vocab_size, "prompt")
    c = _bag_of_tokens(c_tokens, vocab_size, "continuation")
    return float(p @ c / (np.linalg.norm(p) * np.linalg.norm(c)))


def sample_quality_report(
    prompts: Sequence[TokenSeq],
    continuations: Sequence[TokenSeq],
    vocab_size: int,
    ngram: Sequence[int] = (1, 2, 3, 4),
) -> dict[str, float]:
    """All sample-quality scalars for one batch of generations, ready to log.

    Keys: ``rep_<n>`` for each n in ``ngram`` (mean over continuations),
    ``distinct_1``, ``distinct_2`` (pooled over continuations) and
    ``topic_consistency`` (mean over prompt/continuation pairs). Only the
    continuations are scored for repetition and diversity: the prompt is not
    the model's output.
    """
    prompts = list(prompts)
    continuations = list(continuations)
    if len(prompts) != len(continuations):
        raise ValueError(
            f"got {len(prompts)} prompts but {len(continuations)} continuations; "
            "pass one continuation per prompt, in the same order"
        )
    report: dict[str, float] = {}
    for n in ngram:
        report[f"rep_{n}"] = mean_repetition_rate(continuations, n)
    report["distinct_1"] = distinct_n(continuations, 1)
    report["distinct_2"] = distinct_n(continuations, 2)
    consistencies = [topic_consistency(p, c, vocab_size) for p, c in zip(prompts, continuations)]
    report["topic_consistency"] = float(np.mean(consistencies)) if consistencies else 0.0
    return report
