"""The prefix token of rolling windows and empty contexts (issue 26 item 4): lm-eval's convention by default
(the tokenizer's BOS, else its EOS), a suite's `prefix_token` otherwise, and part of the suite's identity."""

from __future__ import annotations

import pytest

ms = pytest.importorskip("mindspore")
pytest.importorskip("lm_eval")

from evald.cli.main import parse_config  # noqa: E402
from evald.config.options import SuiteOptions  # noqa: E402
from evald.pipeline.suites.lm_adapter import EvaldLM  # noqa: E402
from evald.pipeline.suites.runner import SuiteRunner  # noqa: E402
from evald.pipeline.suites.tokenizer import ByteTokenizer, HFTokenizer, bos_id  # noqa: E402
from examples.tiny_lm.benchmarks import write_benchmarks  # noqa: E402
from tests.networks import demo_network_in_graph_mode  # noqa: E402


class HFBytes:
    """A Hugging Face-style tokenizer over bytes, with a BOS (as LLaMA's has)."""

    eos_token_id, bos_token_id = 2, 1

    def encode(self, text, add_special_tokens=True):
        return list(text.encode())

    def decode(self, ids):
        return bytes(ids).decode("utf-8", "replace")


class Scorer:
    max_length = 64


def test_the_default_is_lm_evals_convention_and_a_suite_may_set_another():
    assert EvaldLM(Scorer(), ByteTokenizer()).prefix_token_id == 0            # no BOS: EOS
    hf = HFTokenizer(HFBytes())
    assert bos_id(hf) == 1 and EvaldLM(Scorer(), hf).prefix_token_id == 1       # BOS, as HFLM does
    assert EvaldLM(Scorer(), hf, prefix_token=10).prefix_token_id == 10
    suites = parse_config(["--suites", '{"s": {"tasks": ["t"], "prefix_token": 10}}'], {}).config.suites
    assert suites["s"].prefix_token == 10


def test_the_prefix_token_changes_bits_per_byte_and_the_identity(tmp_path):
    include = write_benchmarks(tmp_path, next_line_count=8, bpb_docs_per_set=1)
    with demo_network_in_graph_mode(seed=5) as network:
        runs = [SuiteRunner("bpb", SuiteOptions(tasks=("bpb_email",), include_path=(include,), batch_size=8,
                                                prefix_token=token), network, ByteTokenizer()) for token in (None, 10)]
        results = [r.run().tasks["bpb_email"].metrics["bits_per_byte"] for r in runs]
    assert [r.identity["prefix_token"] for r in runs] == [0, 10]
    assert runs[0].identity_sha256 != runs[1].identity_sha256
    assert results[0] != results[1]
