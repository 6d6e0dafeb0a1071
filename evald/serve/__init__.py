"""Serve the checkpoint in the compiled network over an OpenAI-compatible HTTP API, every answer naming it.

- ``requests.py``: validate a request body once, at the boundary (sizes, counts, numbers), tokenize it
- ``jobs.py``: the bounded queue between the HTTP thread and evald's main thread, and its counters
- ``engine.py``: run one job on a TokenScorer (echo log-probabilities, greedy or seeded sampling)
- ``responses.py``: OpenAI's completion, chat and logprobs formats, with the step and snapshot digest
- ``app.py``: the Starlette app (routes, bearer token, body limit, errors as 4xx JSON)
- ``http_thread.py``: uvicorn in a background thread with its own event loop; slow clients time out
- ``schedule.py``: which queued job runs now on the network the main thread holds (pinned or latest)

The HTTP thread never touches MindSpore: it validates, tokenizes and queues. evald's main thread
(evald.daemon.serving) runs queued jobs between evaluation batches and between evaluations, so a hot
swap only ever happens between two jobs.

May import: config, contracts, pipeline.
"""
