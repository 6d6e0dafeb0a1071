"""A tokenizer factory whose ``encode`` returns strings (word pieces, not ids) is refused when the tokenizer
is built, naming the tokenizer factory (issue 27, Low 20); on main the suite's build failed later with
"invalid literal for int()" and no word of the factory."""

from __future__ import annotations

import pytest

from evald.contracts.wire import FactorySpec
from evald.pipeline.suites.tokenizer import TokenizerError, build_tokenizer


class WordsNotIds:
    eos_id = 0

    def encode(self, text):
        return text.split()

    def decode(self, ids):
        return " ".join(map(str, ids))


class HFWordsNotIds:
    eos_token_id = 0

    def encode(self, text, add_special_tokens=False):
        return text.split()

    def decode(self, ids):
        return ""


class DecodesToBytes:
    eos_id = 0

    def encode(self, text):
        return list(text.encode())

    def decode(self, ids):
        return bytes(ids)


class Fine:
    eos_id = 0

    def encode(self, text):
        return list(text.encode())

    def decode(self, ids):
        return bytes(ids).decode("utf-8", "replace")


def make(kind: str):
    return {"words": WordsNotIds, "hf_words": HFWordsNotIds, "bytes": DecodesToBytes, "fine": Fine}[kind]()


@pytest.mark.parametrize("kind, said", [("words", "encode"), ("hf_words", "encode"), ("bytes", "decode")])
def test_a_tokenizer_that_gives_no_ids_is_refused_naming_its_factory(kind, said):
    spec = FactorySpec("tests.unit.pipeline.test_tokenizer_output:make", {"kind": kind})
    with pytest.raises(TokenizerError) as refused:
        build_tokenizer(spec)
    message = str(refused.value)
    assert "tests.unit.pipeline.test_tokenizer_output:make" in message and f"{said}(" in message


def test_a_tokenizer_that_gives_ids_is_used():
    tokenizer = build_tokenizer(FactorySpec("tests.unit.pipeline.test_tokenizer_output:make", {"kind": "fine"}))
    assert tokenizer.encode("hi") == [104, 105]
