"""Zero-length documents (issue 35): a suite whose task holds a document with nothing to score is refused
with an error naming the task and the document (its index in the task), never lm-eval's "list index out of
range" nor a plausible number; an empty rolling document among others adds nothing, as lm-eval's own
models score it (0 log-likelihood, 0 bytes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ms = pytest.importorskip("mindspore")
pytest.importorskip("lm_eval")

from evald.config.options import SuiteOptions  # noqa: E402
from evald.pipeline.subset import select_subset  # noqa: E402
from evald.pipeline.suites.runner import SuiteRunner  # noqa: E402
from evald.pipeline.suites.tokenizer import ByteTokenizer  # noqa: E402

NETWORK_SEED = 5

MC = ("output_type: multiple_choice\ndoc_to_text: \"{{context}}\"\ndoc_to_choice: \"{{choices}}\"\n"
      "doc_to_target: \"{{gold}}\"\ntarget_delimiter: \"\"\nmetric_list:\n  - metric: acc\n    aggregation: mean\n"
      "    higher_is_better: true\n")
LL = ("output_type: loglikelihood\ndoc_to_text: \"{{context}}\"\ndoc_to_target: \"{{target}}\"\n"
      "target_delimiter: \"\"\nmetric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n")
GEN = ("output_type: generate_until\ndoc_to_text: \"{{context}}\"\ndoc_to_target: \"{{target}}\"\n"
       "generation_kwargs:\n  until: [\"\\n\"]\n  do_sample: false\n  max_gen_toks: 4\nmetric_list:\n"
       "  - metric: exact_match\n    aggregation: mean\n    higher_is_better: true\n")
ROLLING = ("output_type: loglikelihood_rolling\ndoc_to_text: \"\"\ndoc_to_target: \"{{text}}\"\nmetric_list:\n"
           "  - metric: bits_per_byte\n    aggregation: bits_per_byte\n    higher_is_better: false\n")


def _task(root: Path, name: str, docs: list[dict], body: str) -> None:
    data = root / f"{name}.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in docs))
    (root / f"{name}.yaml").write_text(
        f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {json.dumps(str(data))}\n"
        f"test_split: test\n{body}metadata:\n  version: 1.0\n")


def _mc(i: int) -> dict:
    return {"context": f"x{i} = ", "choices": [f"{i}", f"{i + 1}"], "gold": 0}


def _ll(i: int) -> dict:
    return {"context": f"x{i} = ", "target": f"{i}"}


LIMIT, SEED = 4, 4
BAD = [int(i) for i in select_subset(12, LIMIT, SEED)][1]   # drawn (6, 9, 10, 11): 1 in lm-eval's numbering, 9 here
CASES = {   # task: (its twelve documents, the body, what the error says); no trailing space: lm-eval moves it
    "mc_empty_choice": ([dict(_mc(i), context="x =", choices=["", "7"]) if i == BAD else _mc(i) for i in range(12)], MC,
                        "the continuation '' gives no token"),
    "ll_empty_target": ([dict(_ll(i), context="x =", target="") if i == BAD else _ll(i) for i in range(12)], LL,
                        "the continuation '' gives no token"),
    "ll_empty_both": ([{"context": "", "target": ""} if i == BAD else _ll(i) for i in range(12)], LL,
                      "an empty context and a continuation of no token"),
    "gen_empty_context": ([{"context": "", "target": "x"} if i == BAD else _ll(i) for i in range(12)], GEN,
                          "its context gives no token"),
}


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    root = tmp_path_factory.mktemp("empty")
    for name, (docs, body, _) in CASES.items():
        _task(root, name, docs, body)
    _task(root, "rolling_all_empty", [{"text": ""}] * 3, ROLLING)
    _task(root, "rolling_one_empty", [{"text": "import os\nprint(os.sep)\n"}, {"text": ""},
                                      {"text": "def f(x):\n    return x\n"}], ROLLING)
    _task(root, "rolling_none_empty", [{"text": "import os\nprint(os.sep)\n"},
                                       {"text": "def f(x):\n    return x\n"}], ROLLING)
    _task(root, "rolling_untokenized", [{"text": "abc"}, {"text": "~~~"}], ROLLING)
    return str(root)


class TildeFreeTokenizer(ByteTokenizer):
    """Bytes, but '~' gives no token: a document of only '~' has text and no token."""

    def encode(self, text: str) -> list[int]:
        return [t for t in super().encode(text) if t != ord("~")]


def _runner(tasks: str, task: str, network, limit: int | None = LIMIT, tokenizer=None) -> SuiteRunner:
    return SuiteRunner("s", SuiteOptions(tasks=(task,), include_path=(tasks,), limit=limit, seed=SEED,
                                         batch_size=4), network, tokenizer or ByteTokenizer())


@pytest.mark.parametrize("task", sorted(CASES))
def test_a_document_with_nothing_to_score_is_refused_naming_its_task_and_index(tasks, network, task):
    assert BAD == 9
    with pytest.raises(ValueError) as caught:
        _runner(tasks, task, network)
    message = str(caught.value)
    assert f"task {task}, document {BAD} (of its 12)" in message and CASES[task][2] in message, message


def test_a_rolling_task_of_empty_documents_is_refused_naming_it(tasks, network):
    with pytest.raises(ValueError) as caught:
        _runner(tasks, "rolling_all_empty", network, limit=None)
    assert "task rolling_all_empty: each of its 3 document(s) is empty" in str(caught.value), str(caught.value)


def test_a_rolling_document_whose_text_gives_no_token_is_refused(tasks, network):
    with pytest.raises(ValueError) as caught:
        _runner(tasks, "rolling_untokenized", network, limit=None, tokenizer=TildeFreeTokenizer())
    assert "task rolling_untokenized, document 1 (of its 2): its text of 3 characters gives no token" in str(
        caught.value), str(caught.value)


def test_an_empty_rolling_document_among_others_adds_nothing_as_lm_evals_models_score_it(tasks, network):
    one_empty = _runner(tasks, "rolling_one_empty", network, limit=None).run().tasks["rolling_one_empty"]
    none_empty = _runner(tasks, "rolling_none_empty", network, limit=None).run().tasks["rolling_none_empty"]
    assert one_empty.samples[1]["resps"] == [0.0]
    assert one_empty.metrics["bits_per_byte"] == pytest.approx(none_empty.metrics["bits_per_byte"], rel=1e-9)
