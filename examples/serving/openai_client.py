"""Talk to `evald --serve` with the openai Python client: a completion, and a prompt's log-probabilities.

    python -m examples.serving.openai_client http://127.0.0.1:8000/v1 demo@latest

Prints one JSON object: the step and snapshot each answer came from, the text, the log-probabilities.
"""

import json
import sys

from openai import OpenAI

base_url, model = sys.argv[1], sys.argv[2]
client = OpenAI(base_url=base_url, api_key="unused")   # beyond loopback: the token in serve.token_file

completion = client.completions.create(model=model, prompt="def main(", max_tokens=8, temperature=0)
scored = client.completions.create(model=model, prompt="import os\nimport sys", max_tokens=0, echo=True,
                                   logprobs=1, temperature=0)
raw = client.completions.with_raw_response.create(model=model, prompt="x = 1", max_tokens=1, temperature=0)

print(json.dumps({
    "model": completion.model,                                  # RUN@STEP: the step that answered
    "evald": completion.model_extra["evald"],                   # {"run", "step", "snapshot"}
    "text": completion.choices[0].text,
    "scored_step": scored.model_extra["evald"]["step"],
    "token_logprobs": scored.choices[0].logprobs.token_logprobs,   # None first, then one per token
    "header_step": raw.headers["X-Evald-Step"], "header_snapshot": raw.headers["X-Evald-Snapshot"],
}))
