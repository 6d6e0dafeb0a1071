"""Fixtures shared by the pipeline tests (Graph mode alone is tests/unit/conftest.py's ``graph_mode``)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def include(request, tmp_path_factory):
    """The demo benchmarks (examples/tiny_lm) written for one test module, with the module's
    ``BPB_DOCS_PER_SET`` documents in each bits-per-byte set: lm-eval's include path for its suites."""
    from examples.tiny_lm.benchmarks import write_benchmarks

    return write_benchmarks(tmp_path_factory.mktemp("bench"), next_line_count=40,
                            bpb_docs_per_set=request.module.BPB_DOCS_PER_SET)
