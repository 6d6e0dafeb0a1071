"""What the loop did with the messages it got, as a file beside the ledger (``counters.json``).

How many messages the loop handled, how many of them it ignored (another run, another directory), and how many
frames were not messages at all. Written when a count changes, atomically, after the turn that handled them,
so that an operator, ``evald status`` or a test can wait on what evald did rather than on time passing
("nothing happened" is only a fact once evald has seen the message). Not part of the crash-safe state: a
restart starts the counts again, and a failed write is retried at the next change.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass
from pathlib import Path

from evald.contracts import layout

log = logging.getLogger("evald")

COUNTERS_FILE = "counters.json"


@dataclass(frozen=True)
class MessageCounts:
    handled: int = 0      # valid messages the loop has handled (each is a doorbell at most)
    ignored: int = 0      # ... of which for another run or another directory
    bad_frames: int = 0   # frames that were not valid messages (counted by the receiver)


class CountersFile:
    """A sink (evald.sinks.sink): counters.json, rewritten when the counts change."""

    name = "counters file"

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / COUNTERS_FILE
        self._written: MessageCounts | None = None

    def update(self, counts: MessageCounts) -> None:
        if counts == self._written:
            return
        try:
            layout.atomic_write_text(self.path, json.dumps(dataclasses.asdict(counts), sort_keys=True))
        except OSError as exc:  # a full disk: the counts are not state; the next change tries again
            log.debug("could not write %s: %s", self.path, exc)
            return
        self._written = counts

    def tick(self, state) -> None:   # evald.sinks.sink.RunState (sink.py imports this module)
        self.update(state.messages)

    def close(self) -> None:
        pass


def read_counts(run_dir: Path) -> MessageCounts | None:
    """The counts a running (or stopped) evald last wrote, or None before it wrote any."""
    try:
        data = json.loads((Path(run_dir) / COUNTERS_FILE).read_text())
        return MessageCounts(**{f.name: int(data[f.name]) for f in dataclasses.fields(MessageCounts)})
    except (OSError, ValueError, KeyError, TypeError):
        return None
