"""The tokenizer benchmarks and the HTTP endpoint use: one object, built from a factory, with a hash.

A tokenizer comes from a factory, exactly like the model and the data (``--tokenizer-factory
module:callable`` with ``--tokenizer-kwargs``, or the trainer's announcement). Whatever the factory
returns is wrapped by ``adapt`` into a ``Tokenizer``:

* an object with ``encode(text) -> list[int]``, ``decode(ids) -> str`` and ``eos_id`` is used as is;
* a Hugging Face-style tokenizer (what MindFormers uses: ``encode(text, add_special_tokens=False)``,
  ``decode(ids)``, ``eos_token_id``) is wrapped by ``HFTokenizer``, which never adds special tokens
  (lm-eval adds what a task needs itself);
* ``ByteTokenizer`` is the demo's: UTF-8 bytes are the token ids (vocabulary 256).

A tokenizer may also say its beginning-of-sequence token (``bos_id``, an int or None; a Hugging Face
tokenizer's ``bos_token_id``): lm-eval's convention puts it before a rolling window's first token and
before an empty context, and the EOS token when there is none (``bos_id()``; a suite's ``prefix_token``
overrides it, evald.pipeline.suites.lm_adapter).

``tokenizer_hash`` names what a tokenizer does, not what it is called: the sha256 of its class,
EOS id, vocabulary (when it exposes ``get_vocab()``) and the ids it gives a fixed probe text.
It is part of a suite's identity (evald.pipeline.suites.runner); a tokenizer whose hash changes between
checkpoints of one run is an error (``TokenizerChanged``), because the numbers would not compare.

May import: contracts (and the pipeline's own factories module).
"""

from __future__ import annotations

import functools
import hashlib
import json
import numbers
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, Sequence, runtime_checkable

from evald.contracts.wire import FactorySpec
from evald.pipeline.factories import call_factory

# Covers ASCII, whitespace runs, digits, code and multi-byte UTF-8, so that two tokenizers that
# split any of these differently hash differently.
PROBE_TEXT = ("The quick brown fox jumps over the lazy dog.\n\tdef f(x):  return x ** 2  # 0123456789\n"
              "  \"quoted\" 'single' <tag/> {json: [1, 2.5e-3]} café naïve 日本語 Ελληνικά 🙂\r\n")


class TokenizerError(ValueError):
    """A tokenizer factory returned something that cannot tokenize."""


class TokenizerChanged(RuntimeError):
    """The tokenizer of a run changed between two of its checkpoints."""


@runtime_checkable
class Tokenizer(Protocol):
    eos_id: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


@dataclass(frozen=True)
class ByteTokenizer:
    """UTF-8 bytes as token ids (the demo's byte-level GPT). EOS defaults to NUL, which text never holds."""

    eos_id: int = 0
    vocab_size: ClassVar[int] = 256   # token ids a client may send (evald.serve checks them)
    bos_id: ClassVar[int | None] = None

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(int(i) & 0xFF for i in ids).decode("utf-8", "replace")


class HFTokenizer:
    """A Hugging Face-style tokenizer (``encode(text, add_special_tokens=...)``, ``eos_token_id``)."""

    def __init__(self, inner: Any) -> None:
        eos = getattr(inner, "eos_token_id", None)
        if not isinstance(eos, int):
            raise TokenizerError(f"{type(inner).__name__} has no integer eos_token_id (got {eos!r}); "
                                 f"set one on the tokenizer your factory returns")
        self.inner, self.eos_id = inner, eos
        bos = getattr(inner, "bos_token_id", None)
        self.bos_id: int | None = bos if isinstance(bos, int) and not isinstance(bos, bool) else None

    def encode(self, text: str) -> list[int]:
        return [int(i) for i in self.inner.encode(text, add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.inner.decode([int(i) for i in ids]))

    @property
    def vocab_size(self) -> int | None:
        if hasattr(self.inner, "__len__"):  # Hugging Face: len() counts the added tokens, vocab_size does not
            return len(self.inner)
        size = getattr(self.inner, "vocab_size", None)
        return size if isinstance(size, int) else None


def adapt(obj: Any, where: str = "the tokenizer factory") -> Tokenizer:
    """``obj`` as a Tokenizer, or TokenizerError saying which method it lacks."""
    for method in ("encode", "decode"):
        if not callable(getattr(obj, method, None)):
            raise TokenizerError(f"{where} returned {type(obj).__name__}, which has no {method}() method; "
                                 f"return an object with encode(text), decode(ids) and eos_id (or a Hugging "
                                 f"Face-style tokenizer)")
    if isinstance(getattr(obj, "eos_id", None), int):
        tokenizer: Tokenizer = obj
        encode = obj.encode
    elif hasattr(obj, "eos_token_id"):
        tokenizer = HFTokenizer(obj)
        encode = functools.partial(obj.encode, add_special_tokens=False)
    else:
        raise TokenizerError(f"{where} returned {type(obj).__name__}, which has neither eos_id nor eos_token_id")
    _check_output(type(obj).__name__, encode, tokenizer.decode, where)
    return tokenizer


def _check_output(name: str, encode: Any, decode: Any, where: str) -> None:
    """TokenizerError naming ``where`` unless ``encode`` gives integer ids and ``decode`` a string: found at
    start, not as "invalid literal for int()" when a suite is built."""
    try:
        ids = list(encode(PROBE_TEXT))
    except Exception as exc:  # noqa: BLE001 - whatever the factory's object raises
        raise TokenizerError(f"{where} returned {name}, whose encode(text) raised {exc!r}") from None
    wrong = next((i for i in ids if isinstance(i, bool) or not isinstance(i, numbers.Integral)), None)
    if wrong is not None or not ids:
        raise TokenizerError(f"{where} returned {name}, whose encode(text) gives "
                             f"{'nothing' if not ids else f'{type(wrong).__name__} items such as {wrong!r}'}, not "
                             f"integer token ids; return a tokenizer whose encode(text) returns a list of ints")
    try:
        text = decode([int(i) for i in ids])
    except Exception as exc:  # noqa: BLE001
        raise TokenizerError(f"{where} returned {name}, whose decode(ids) raised {exc!r}") from None
    if not isinstance(text, str):
        raise TokenizerError(f"{where} returned {name}, whose decode(ids) gives {type(text).__name__}, not str; "
                             f"return a tokenizer whose decode(ids) returns text")


def bos_id(tokenizer: Tokenizer) -> int | None:
    """The tokenizer's beginning-of-sequence id (its optional ``bos_id``), or None when it has none."""
    value = getattr(tokenizer, "bos_id", None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def build_tokenizer(spec: FactorySpec | None) -> Tokenizer:
    """The tokenizer ``spec`` names; without one, the byte tokenizer."""
    if spec is None:
        return ByteTokenizer()
    return adapt(call_factory(spec, "tokenizer"), f"the tokenizer factory {spec.target!r}")


def vocabulary_size(tokenizer: Tokenizer) -> int | None:
    """How many token ids the tokenizer has (``vocab_size``, else ``len(get_vocab())``), or None."""
    size = getattr(tokenizer, "vocab_size", None)
    if isinstance(size, int):
        return size
    vocab = getattr(getattr(tokenizer, "inner", tokenizer), "get_vocab", None)
    return len(vocab()) if callable(vocab) else None


def check_covers(tokenizer: Tokenizer, model_vocab: int) -> None:
    """TokenizerError unless the tokenizer's ids are the model's: the same vocabulary, or the model's
    padded past it (LLMs round their embedding up, e.g. to a multiple of 64 or 128: at most 1% or 128
    ids). A tokenizer larger than the model gives ids past its logits; a much smaller one (the byte
    tokenizer on a 32,000-token model) scores text the model never saw as its tokens: numbers that
    look plausible and mean nothing."""
    size = vocabulary_size(tokenizer)
    if size is None:
        return  # nothing to compare: the tokenizer does not say
    padding = max(128, model_vocab // 100)
    if size > model_vocab or model_vocab - size > padding:
        what = "the byte tokenizer (no --tokenizer-factory)" if isinstance(tokenizer, ByteTokenizer) else (
            f"the tokenizer {type(getattr(tokenizer, 'inner', tokenizer)).__name__}")
        raise TokenizerError(f"{what} has {size} token ids and the model's vocabulary (its logits) {model_vocab}: "
                             f"it cannot be the model's tokenizer; give the model's own with --tokenizer-factory "
                             f"(docs/benchmarks.md)")


def tokenizer_hash(tokenizer: Tokenizer) -> str:
    """sha256 of what the tokenizer does: class, EOS, vocabulary if exposed, the probe text's ids."""
    inner = getattr(tokenizer, "inner", tokenizer)
    vocab = getattr(inner, "get_vocab", None)
    described = {
        "class": f"{type(inner).__module__}.{type(inner).__qualname__}",
        "eos_id": int(tokenizer.eos_id),
        "probe": [int(i) for i in tokenizer.encode(PROBE_TEXT)],
        "vocab": sorted((str(k), int(v)) for k, v in vocab().items()) if callable(vocab) else None,
    }
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()


def check_unchanged(recorded: str | None, current: str, step: int) -> None:
    """TokenizerChanged if ``current`` differs from the hash this run's earlier checkpoints used."""
    if recorded is not None and recorded != current:
        raise TokenizerChanged(f"the tokenizer changed between checkpoints of this run: step {step} would be "
                               f"scored with tokenizer {current[:12]}, earlier steps with {recorded[:12]}; "
                               f"benchmark numbers from two tokenizers do not compare. Restore the run's "
                               f"tokenizer, or evaluate into a new --logdir")
