"""A tokenizer that cannot cover the model's vocabulary is refused, naming both sizes (issue 26,
item 7): benchmarks defaulted to the byte tokenizer, and nothing refused 256 byte tokens on a
32,000-token model, which gives plausible, wrong numbers. A model's vocabulary padded past the
tokenizer's (a multiple of 64 or 128, as LLMs do) is not a mismatch."""

from __future__ import annotations

import pytest

from evald.pipeline.suites.tokenizer import ByteTokenizer, TokenizerError, check_covers


class Sized:
    eos_token_id = 2

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def encode(self, text, add_special_tokens=False):
        return [3]

    def decode(self, ids):
        return "x"


def test_the_byte_tokenizer_on_a_32000_token_model_is_refused_naming_both_sizes():
    with pytest.raises(TokenizerError, match=r"256.*32000|32000.*256"):
        check_covers(ByteTokenizer(), 32000)


def test_a_tokenizer_larger_than_the_model_is_refused():
    from evald.pipeline.suites.tokenizer import adapt

    with pytest.raises(TokenizerError, match=r"32000.*256|256.*32000"):
        check_covers(adapt(Sized(32000)), 256)


def test_equal_sizes_and_a_padded_model_vocabulary_are_accepted():
    from evald.pipeline.suites.tokenizer import adapt

    check_covers(ByteTokenizer(), 256)
    check_covers(adapt(Sized(32000)), 32000)
    check_covers(adapt(Sized(151646)), 151936)     # Qwen's tokenizer and its padded embedding
    check_covers(adapt(Sized(32000)), 32064)
