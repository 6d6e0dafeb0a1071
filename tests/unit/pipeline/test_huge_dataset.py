"""A huge dataset with a small limit (issue 35, still open from the third round): a suite whose task holds
10**8 documents and a validation set of 10**8 samples, each read lazily and counted, with a limit of a few
documents. Building the suite (its tasks, the seeded selection, the identity's hash of the chosen documents,
and lm-eval's dry run over them) reads a number of documents proportional to the limit, never the dataset."""

from __future__ import annotations

import json
import os

import pytest

from evald.pipeline.subset import fixed_batches, select_subset

NETWORK_SEED = 5
HUGE = 10 ** 8
READ_BUDGET = 1000   # a read past this raises: the whole dataset would be 10**8
READS = "EVALD_TEST_HUGE_DOCS_READS"

# The task's documents: a lazy sequence lm-eval gets from process_docs (an lm-eval task's documents must
# have ``features``, as a datasets.Dataset does). It counts its reads in the environment, because lm-eval
# imports this module itself (from the task directory), not as the test's module.
HUGE_DOCS = f'''
import os
from collections.abc import Sequence

HUGE, BUDGET, READS = {HUGE}, {READ_BUDGET}, {READS!r}


class HugeDocs(Sequence):
    features = {{"context": None, "choices": None, "gold": None}}

    def __len__(self):
        return HUGE

    def __getitem__(self, index):
        if isinstance(index, slice):
            raise TypeError("HugeDocs reads one document at a time")
        if not 0 <= index < HUGE:
            raise IndexError(index)
        reads = int(os.environ.get(READS, "0")) + 1
        os.environ[READS] = str(reads)
        if reads > BUDGET:
            raise RuntimeError(f"{{reads}} documents read of a dataset of {{HUGE}}: the whole dataset is being read")
        return {{"context": f"line {{index}} = ", "choices": [f"{{index}}", f"{{index + 1}}"], "gold": index % 2}}


def docs(dataset):
    return HugeDocs()
'''


@pytest.fixture
def huge_task(tmp_path):
    root = tmp_path / "huge"
    root.mkdir()
    (root / "huge_docs.py").write_text(HUGE_DOCS)
    (root / "seed.jsonl").write_text(json.dumps({"context": "a", "choices": ["b", "c"], "gold": 0}) + "\n")
    shots = json.dumps([{"context": "x = ", "choices": ["1", "2"], "gold": 0}])
    (root / "huge_mc.yaml").write_text(
        f"task: huge_mc\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {json.dumps(str(root / 'seed.jsonl'))}\n"
        "test_split: test\nprocess_docs: !function huge_docs.docs\n"
        f"fewshot_config:\n  samples: {shots}\n"   # lm-eval lists a task's few-shot split whole: a small one
        "output_type: multiple_choice\ndoc_to_text: \"{{context}}\"\ndoc_to_choice: \"{{choices}}\"\n"
        "doc_to_target: \"{{gold}}\"\ntarget_delimiter: \"\"\nmetric_list:\n  - metric: acc\n"
        "    aggregation: mean\n    higher_is_better: true\nmetadata:\n  version: 1.0\n")
    os.environ[READS] = "0"
    try:
        yield str(root)
    finally:
        os.environ.pop(READS, None)


def test_a_suite_with_a_small_limit_on_a_huge_task_reads_documents_in_proportion_to_the_limit(huge_task, network):
    pytest.importorskip("lm_eval")
    from evald.config.options import SuiteOptions
    from evald.pipeline.suites.runner import SuiteRunner
    from evald.pipeline.suites.tokenizer import ByteTokenizer

    runner = SuiteRunner("huge", SuiteOptions(tasks=("huge_mc",), include_path=(huge_task,), limit=4, seed=3,
                                              batch_size=4), network, ByteTokenizer())
    reads = int(os.environ[READS])
    assert runner.identity["tasks"]["huge_mc"]["documents"] == HUGE
    assert runner.documents["huge_mc"] == [int(i) for i in select_subset(HUGE, 4, 3)]
    assert reads <= 50, f"{reads} documents read to build a suite of 4 (the tasks, the hash, lm-eval's dry run)"


class CountedSamples:
    """A validation set of 10**8 samples, computed when read; more than READ_BUDGET reads raise."""

    def __init__(self) -> None:
        self.reads = 0

    def __len__(self) -> int:
        return HUGE

    def __getitem__(self, index: int):
        import numpy as np

        self.reads += 1
        if self.reads > READ_BUDGET:
            raise RuntimeError("the whole validation set is being read")
        return np.full(8, index % 251, np.int32)


def test_the_validation_subset_of_a_huge_set_reads_only_its_samples():
    data = CountedSamples()
    indices = select_subset(len(data), 64, 7)
    batches = fixed_batches(data, indices, 16)
    assert len(indices) == 64 and len(batches) == 4 and data.reads == 64   # numpy draws 64 of 10**8 in O(64)
