"""Benchmark suites: lm-evaluation-harness tasks scored on the compiled network, through the engine.

- ``scoring.py``: the engine's old import path (evald.pipeline.engine), kept one release
- ``bucket_plan.py``: a suite's dry run: the rows it runs, to fit the engine's buckets before any graph
- ``tokenizer.py``: the tokenizer factory, adapted to one interface, with a hash
- ``lm_adapter.py``: lm-eval's ``LM`` (a ``TemplateLM``) over a TokenScorer
- ``runner.py``: ``SuiteRunner``: a suite's tasks, its fixed document subset, its identity, its results
- ``task_files.py``: task YAML is code: its files, includes, ``!function`` modules judged by the trust rule
- ``lm_eval_metrics.py``: the metric names each task of a suite reports (``--monitor``'s start-up check)

May import: config, contracts, files; within evald.pipeline: engine, factories, subset, tasks.
"""
