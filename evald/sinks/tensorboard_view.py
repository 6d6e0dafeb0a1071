"""What a sub-run's event file holds: ONE current value per (tag, step), in step order, from the ledger.

TensorBoard's own server (its Rust data server, the default since 2.5) keeps a tag's points as a
stream: a point at a step at or below the tag's latest step drops every point of that tag from that
step on ("preemption", meant for a training job restarted from a checkpoint). The event files keep
them, but no page shows them. evald writes points out of step order by design (a backfill newest
first, ``evald retry --step``, cells finished after a restart, an eval group), so a sub-run's file is
not an append-only log of the outbox but a view of it:

* each (tag, step) shows the value of the LAST record that wrote it (a re-evaluation wins over the
  result it superseded);
* an ``evald/superseded`` record at a step removes the validation's values written before it at
  that step (its evaluation, or the skip text of one that failed): until the step is evaluated
  again it has no current validation value;
* a skip text (``evald/skipped``) at a step whose validation was evaluated after it is replaced by
  a text saying so, not dropped: a TensorBoard that already read the old text keeps a point until a
  newer one replaces it at the same step;
* the Custom Scalars layout (one tag) keeps only its newest record: the plugin shows one layout.

The sink appends a record while each of its tags only moves forward (``Order``); any other record
makes it rewrite the sub-run's file from ``events(records)``, which TensorBoard reads as one
in-order stream replacing what it had (tensorboard.py says how the file is replaced).

Imports only the ledger's record types and the shown tags (tensorboard_layout.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

from evald.ledger.ledger import SUPERSEDED_TAG, Record
from evald.ledger.skips import TAG as SKIP_TAG
from evald.sinks.tensorboard_layout import (LAYOUT_STREAM, LAYOUT_TAG, LOSS, SAMPLE_TEXTS, preformatted, shown_eval_scalars,
                                            shown_text_tag, suite_results)

SUB_RUNS = {"train": "train", "eval": "eval", "summary": "eval", LAYOUT_STREAM: "eval"}  # stream -> sub-run
STREAM_PREFIXES = {"train": "train/", "eval": "eval/"}           # dropped from tags in the sub-run
VALIDATION_MARK = "evald/evaluate_s"  # a scalar only the default validation's evaluation record carries


def sub_run(stream: str) -> str:
    return SUB_RUNS.get(stream, stream)


def streams_of(name: str, known: Iterable[str] = ()) -> list[str]:
    """The streams written to sub-run ``name`` (a stream outside SUB_RUNS is its own sub-run)."""
    return sorted({s for s, n in SUB_RUNS.items() if n == name} | {s for s in known if sub_run(s) == name})


def shown_tag(stream: str, tag: str) -> str:
    """The tag as TensorBoard shows it in the stream's sub-run: ``eval/loss`` -> ``Loss``, ``eval/accuracy``
    -> ``accuracy`` (tensorboard_layout.LOSS says why the capital)."""
    prefix = STREAM_PREFIXES.get(stream)
    if not (prefix and tag.startswith(prefix) and len(tag) > len(prefix)):
        return tag
    name = tag[len(prefix):]
    return LOSS if name == "loss" else name


def shown(record: Record) -> tuple[dict[str, float], dict[str, str]]:
    """A record's scalars and texts as written in its sub-run (tensorboard_layout.py says why: an SE's
    bounds, a suite's table of results); a layout record is its one text, ``LAYOUT_TAG``."""
    def name(tag: str) -> str:
        return shown_tag(record.stream, tag)

    if record.stream == "eval":
        return (shown_eval_scalars(record.scalars, name),
                {**{shown_text_tag(name(k)): preformatted(v) if k.startswith(SAMPLE_TEXTS[0]) else v
                    for k, v in record.texts.items()}, **suite_results(record.scalars, record.texts)})
    if record.stream == LAYOUT_STREAM:
        return {}, dict(record.texts)
    return {name(k): v for k, v in record.scalars.items()}, {name(k): v for k, v in record.texts.items()}


def tags(record: Record) -> set[str]:
    scalars, texts = shown(record)
    return {*scalars, *texts}


@dataclass
class Event:
    """One event of the file: the current values a record still holds at its step."""

    step: int
    wall_time: float
    scalars: dict[str, float] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict)
    layout: str | None = None  # a layout record's JSON (tensorboard_layout.layout_summary)


def events(records: Iterable[Record]) -> list[Event]:
    """The sub-run's file: every (tag, step)'s current value, in step order (then commit order)."""
    current: dict[tuple[str, int], tuple[int, float | str]] = {}  # (tag, step) -> (record's index, value)
    validation: dict[int, set[str]] = {}   # step -> tags the validation wrote there (removed if superseded)
    by_index: list[Record] = []
    layout_at: tuple[str, int] | None = None
    for index, record in enumerate(records):
        by_index.append(record)
        scalars, texts = shown(record)
        step = record.step
        if record.stream == "eval" and SUPERSEDED_TAG in record.texts:
            for tag in validation.pop(step, set()):
                current.pop((tag, step), None)
        if record.stream == "eval" and VALIDATION_MARK in record.scalars:
            skipped = current.get((SKIP_TAG, step))
            if skipped is not None:  # evaluated after all: said at the same step, in place of the skip
                current[(SKIP_TAG, step)] = (skipped[0], evaluated_after_skip(str(skipped[1])))
        if record.stream == LAYOUT_STREAM:
            if layout_at is not None:
                current.pop(layout_at, None)
            layout_at = (LAYOUT_TAG, step)
        if record.stream == "eval" and (VALIDATION_MARK in record.scalars or SKIP_TAG in record.texts):
            validation.setdefault(step, set()).update({*scalars, *texts})
        for tag, value in {**scalars, **texts}.items():
            current[(tag, step)] = (index, value)
    grouped: dict[tuple[int, int], Event] = {}
    for (tag, step), (index, value) in current.items():
        record = by_index[index]
        event = grouped.setdefault((step, index), Event(step, record.wall_time))
        if record.stream == LAYOUT_STREAM:
            event.layout = str(value)
        elif isinstance(value, str):
            event.texts[tag] = value
        else:
            event.scalars[tag] = value
    return [grouped[key] for key in sorted(grouped)]


def evaluated_after_skip(text: str) -> str:
    return f"evaluated after all: this step's result is current (before: {text})"


class Order:
    """The highest step of each tag in a sub-run's file: a record that moves every tag forward is
    appended; any other needs the file rewritten (``events``)."""

    def __init__(self, written: Iterable[Event] = ()) -> None:
        self.latest: dict[str, int] = {}
        for event in written:
            for tag in (*event.scalars, *event.texts, *((LAYOUT_TAG,) if event.layout is not None else ())):
                self.latest[tag] = max(self.latest.get(tag, event.step), event.step)

    def appendable(self, record: Record) -> bool:
        if record.stream == "eval" and SUPERSEDED_TAG in record.texts:
            return False  # it removes values written before it at its step
        if (record.stream == "eval" and VALIDATION_MARK in record.scalars
                and self.latest.get(SKIP_TAG, record.step - 1) >= record.step):
            return False  # it may replace a skip text at its step
        return all(self.latest.get(tag, record.step - 1) < record.step for tag in tags(record))

    def note(self, record: Record) -> None:
        for tag in tags(record):
            self.latest[tag] = max(self.latest.get(tag, record.step), record.step)


def by_sub_run(records: Iterable[Record]) -> Mapping[str, list[Record]]:
    out: dict[str, list[Record]] = {}
    for record in records:
        out.setdefault(sub_run(record.stream), []).append(record)
    return out
