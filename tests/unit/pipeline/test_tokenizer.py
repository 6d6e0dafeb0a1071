"""The tokenizer seam: a factory's object adapted to encode/decode/eos_id, hashed by what it does.

transformers is not installed here, so the Hugging Face-style tokenizer is a small class with the
same methods MindFormers' tokenizers have (``encode(text, add_special_tokens=...)``, ``decode``,
``eos_token_id``, ``get_vocab``); that is the interface the adapter relies on.
"""

from __future__ import annotations

import pytest

from evald.contracts.wire import FactorySpec
from evald.pipeline.suites.tokenizer import (ByteTokenizer, HFTokenizer, TokenizerChanged, TokenizerError, adapt,
                                      build_tokenizer, check_unchanged, tokenizer_hash)


class WordPieceLike:
    """HF-style: adds a BOS unless told not to, exactly what the adapter must prevent."""

    eos_token_id = 2

    def __init__(self, shift: int = 0) -> None:
        self.shift = shift

    def encode(self, text, add_special_tokens=True):
        ids = [3 + ((ord(c) + self.shift) % 97) for c in text]
        return ([1] if add_special_tokens else []) + ids

    def decode(self, ids):
        return "".join(chr(i - 3) for i in ids)

    def get_vocab(self):
        return {"<bos>": 1, "<eos>": 2, **{f"c{i}": 3 + i for i in range(97)}}


def make_wordpiece(shift: int = 0) -> WordPieceLike:
    return WordPieceLike(shift)


def test_byte_tokenizer_round_trips_utf8():
    tok = ByteTokenizer()
    ids = tok.encode("café 🙂")
    assert ids == list("café 🙂".encode()) and tok.decode(ids) == "café 🙂" and tok.eos_id == 0


def test_hf_style_tokenizer_gets_no_special_tokens():
    tok = adapt(WordPieceLike())
    assert isinstance(tok, HFTokenizer) and tok.eos_id == 2
    assert tok.encode("ab") == [3 + ord("a") % 97, 3 + ord("b") % 97]


def test_anything_with_the_methods_is_used_as_is():
    tok = ByteTokenizer(eos_id=10)
    assert adapt(tok) is tok


def test_factory_builds_and_errors_name_the_missing_method():
    spec = FactorySpec("tests.unit.pipeline.test_tokenizer:make_wordpiece", {"shift": 1})
    assert isinstance(build_tokenizer(spec), HFTokenizer)
    assert isinstance(build_tokenizer(None), ByteTokenizer)
    with pytest.raises(TokenizerError, match="no decode"):
        adapt(type("OnlyEncode", (), {"encode": lambda self, t: []})())
    with pytest.raises(TokenizerError, match="neither eos_id nor eos_token_id"):
        adapt(type("NoEos", (), {"encode": lambda self, t: [], "decode": lambda self, i: ""})())


def test_hash_follows_behaviour_and_a_change_is_named():
    assert tokenizer_hash(ByteTokenizer()) == tokenizer_hash(ByteTokenizer())
    assert tokenizer_hash(ByteTokenizer()) != tokenizer_hash(ByteTokenizer(eos_id=10))
    assert tokenizer_hash(adapt(make_wordpiece(0))) != tokenizer_hash(adapt(make_wordpiece(1)))
    check_unchanged(None, "a" * 64, 5)
    check_unchanged("a" * 64, "a" * 64, 5)
    with pytest.raises(TokenizerChanged, match="tokenizer changed between checkpoints"):
        check_unchanged("a" * 64, "b" * 64, 10)
