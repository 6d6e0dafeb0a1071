"""Benchmark suites: lm-evaluation-harness tasks scored on the compiled network.

- ``scoring.py``: ``TokenScorer``: token log-probabilities and greedy generation in fixed shape buckets
- ``tokenizer.py``: the tokenizer factory, adapted to one interface, with a hash
- ``lm_adapter.py``: lm-eval's ``LM`` (a ``TemplateLM``) over a TokenScorer
- ``runner.py``: ``SuiteRunner``: a suite's tasks, its fixed document subset, its identity, its results
- ``task_files.py``: task YAML is code: its files, includes, ``!function`` modules judged by the trust rule
- ``lm_eval_metrics.py``: the metric names each task of a suite reports (``--monitor``'s start-up check)

May import: config, contracts, files; within evald.pipeline: factories, subset, tasks.
"""
