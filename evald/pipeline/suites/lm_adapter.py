"""lm-evaluation-harness's ``LM`` interface over evald's compiled network (through a TokenScorer).

``EvaldLM`` is a ``lm_eval.api.model.TemplateLM`` of world size 1, so lm-eval does the tokenizing
conventions itself (``_encode_pair`` moves the context's trailing whitespace into the continuation;
an empty context is scored after the prefix/EOS token) and evald does the scoring:

* ``loglikelihood``: (sum of the continuation's token log-probabilities, whether every token is the
  argmax), in the scorer's fixed buckets;
* ``loglikelihood_rolling``: HFLM's disjoint rolling windows
  (``get_rolling_token_windows(tokens, prefix_token, max_length, context_len=1)`` +
  ``make_disjoint_window``), every window of every document scored in one pass, summed per document;
  ``prefix_token`` (also the context of an empty one) is the suite's ``prefix_token``, by default
  lm-eval's HFLM convention: the tokenizer's BOS, else its EOS;
* ``generate_until``: greedy decoding only (a request asking for sampling is a ValueError), stopping
  at any ``until`` string (cut from the text, as HFLM does), at EOS, or at ``max_gen_toks``; the stop
  check decodes only the last few tokens at each step (``_stopper``), and the scorer decodes with
  the network's cache when it has one (evald.pipeline.engine).

A document that gives nothing to score is ``EmptyDocument`` (naming its task and its place in lm-eval's
selection; the suite runner names the document), never a plausible number nor lm-eval's IndexError: a
continuation of zero tokens (HFLM would score it 0, the likeliest choice of all), a generation context of
zero tokens, a rolling document whose text gives no token, and a rolling task whose every document is
empty (lm-eval's bits_per_byte would divide by zero bytes). An empty rolling document among others adds
0 to the log-likelihood and 0 bytes, as HFLM's does (lm-eval's own behaviour for the metric).

The ``scorer`` is anything with TokenScorer's ``score``/``generate``/``max_length``: the local
TokenScorer, or an eval group's scorer that splits the requests over its ranks (lm-eval still sees
one rank; evald.pipeline.group.evaluator).

May import: the pipeline's engine and tokenizer modules.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from lm_eval import utils as lm_utils
from lm_eval.api.model import TemplateLM

from evald.pipeline.engine import GenerateRequest, ScoreRequest
from evald.pipeline.suites.tokenizer import Tokenizer, bos_id

DEFAULT_MAX_GEN_TOKS = 256


@dataclass
class AdapterCounts:
    loglikelihood: int = 0
    rolling_windows: int = 0
    generated: int = 0
    nonfinite: int = 0          # log-likelihoods that came out NaN or Inf (the runner fails the suite on any)


class EmptyDocument(ValueError):
    """A document of a suite's task gives nothing to score (see the module's docstring). ``document`` is its
    place in lm-eval's run of the task (None: the task as a whole); the suite runner maps it to its index."""

    def __init__(self, task: str | None, document: int | None, what: str) -> None:
        self.task, self.document, self.what = task, document, what
        super().__init__(f"task {task}, document {document}: {what}" if document is not None else
                         f"task {task}: {what}")


class EvaldLM(TemplateLM):
    def __init__(self, scorer: Any, tokenizer: Tokenizer, *, max_gen_toks: int = DEFAULT_MAX_GEN_TOKS,
                 prefix_token: int | None = None) -> None:
        super().__init__()
        self.scorer, self.evald_tokenizer, self.max_gen_toks = scorer, tokenizer, max_gen_toks
        self.counts = AdapterCounts()
        # lm-eval's HFLM: a custom prefix token, else BOS, else EOS (TemplateLM's own default is EOS only)
        bos = bos_id(tokenizer)
        self._prefix_token = int(prefix_token if prefix_token is not None else bos if bos is not None
                                 else tokenizer.eos_id)
        self._asked: list[Any] | None = None   # the Instances of the loglikelihood call under way

    # -- what TemplateLM needs -------------------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        return int(self.evald_tokenizer.eos_id)

    @property
    def prefix_token_id(self) -> int:
        return self._prefix_token

    @property
    def max_length(self) -> int:
        return int(self.scorer.max_length)

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        return list(self.evald_tokenizer.encode(string))

    def tok_decode(self, tokens: list[int]) -> str:
        return self.evald_tokenizer.decode(tokens)

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """TemplateLM's tokenizing, each request's document known to ``_loglikelihood_tokens`` (its requests are
        these, in order) and an empty context with an empty continuation refused (TemplateLM indexes its
        first token)."""
        for req in requests:
            context, continuation = req.args
            if context == "" and not self.tok_encode(continuation):
                raise EmptyDocument(req.task_name, req.doc_id, "an empty context and a continuation of no token: "
                                                               "nothing to score")
        self._asked = list(requests)
        try:
            return super().loglikelihood(requests, disable_tqdm=disable_tqdm)
        finally:
            self._asked = None

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs: Any) -> list[tuple[float, bool]]:
        for index, (pair, _, continuation) in enumerate(requests):
            if not continuation:
                asked = self._asked[index] if self._asked is not None and index < len(self._asked) else None
                raise EmptyDocument(getattr(asked, "task_name", None), getattr(asked, "doc_id", None),
                                    f"the continuation {str(pair[1])[:40]!r} gives no token to score (a choice or "
                                    f"target of no token would score 0, likelier than any other)")
        scores = self.scorer.score([ScoreRequest(list(context), list(continuation))
                                    for _, context, continuation in requests])
        self.counts.loglikelihood += len(requests)
        totals = [(s.total, s.is_greedy) for s in scores]
        self.counts.nonfinite += sum(1 for total, _ in totals if not math.isfinite(total))
        return totals

    # -- rolling log-likelihood (bits per byte, perplexity) --------------------------------------
    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        windows: list[ScoreRequest] = []
        owner: list[int] = []
        texts_by_task: dict[Any, list[str]] = {}
        for req in requests:
            texts_by_task.setdefault(req.task_name, []).append(req.args[0])
        for task, texts in texts_by_task.items():
            if not any(texts):
                raise EmptyDocument(task, None, f"each of its {len(texts)} document(s) is empty: a rolling metric "
                                                f"(bits_per_byte) would divide by zero bytes")
        for index, req in enumerate(requests):
            (string,) = req.args
            tokens = self.tok_encode(string)
            if string and not tokens:
                raise EmptyDocument(req.task_name, req.doc_id, f"its text of {len(string)} characters gives no "
                                                               f"token: it would count its bytes with nothing scored")
            for context, continuation in map(lm_utils.make_disjoint_window, lm_utils.get_rolling_token_windows(
                    token_list=tokens, prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length, context_len=1)):
                windows.append(ScoreRequest(context, continuation))
                owner.append(index)
        totals = [0.0] * len(requests)
        for index, score in zip(owner, self.scorer.score(windows)):
            totals[index] += score.total
        self.counts.rolling_windows += len(windows)
        self.counts.nonfinite += sum(1 for total in totals if not math.isfinite(total))
        return totals

    # -- greedy generation -----------------------------------------------------------------------
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        prepared: list[tuple[list[str], GenerateRequest]] = []
        for req in requests:
            context, gen_kwargs = req.args
            kwargs = dict(gen_kwargs or {})
            if kwargs.pop("do_sample", False) or float(kwargs.pop("temperature", 0.0) or 0.0) > 0.0:
                raise ValueError(f"evald decodes greedily only; the task asks for sampling ({gen_kwargs}); "
                                 f"set do_sample: false and temperature: 0 in its generation_kwargs")
            until = kwargs.pop("until", None) or []
            until = [until] if isinstance(until, str) else list(until)
            eos_text = self.tok_decode([self.eot_token_id])
            if eos_text and eos_text not in until:
                until.append(eos_text)
            max_new = int(kwargs.pop("max_gen_toks", self.max_gen_toks))
            stop = self._stopper(until)
            tokens = self.tok_encode(context)
            if not tokens:
                raise EmptyDocument(req.task_name, req.doc_id, "its context gives no token: nothing to generate from")
            prepared.append((until, GenerateRequest(tokens, max_new, stop)))
        outputs = self.scorer.generate([g for _, g in prepared], eos_id=self.eot_token_id)
        texts = []
        for (until, _), ids in zip(prepared, outputs):
            text = self.tok_decode(ids)
            for stop in until:
                if stop:
                    text = text.split(stop)[0]
            texts.append(text)
            self.counts.generated += len(ids)
        return texts

    def _stopper(self, until: list[str]):
        """Whether the ids so far hold a stop string, decoding only their tail (as lm-eval's
        MultiTokenEOSCriteria does): the last len(encode(stop)) + 2 tokens, not the whole continuation,
        at each new token. A stop string that the tail misses still cuts the text in generate_until."""
        stops = [s for s in until if s]
        if not stops:
            return None
        tail = max(len(self.tok_encode(s)) for s in stops) + 2
        return lambda ids: any(s in self.tok_decode(ids[-tail:]) for s in stops)
