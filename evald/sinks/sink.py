"""The one interface of a run's outputs: what a sink is, and the committed state it is ticked with.

After every turn of the loop (``Run.tick``, and at the end of ``Run.work``) the run ticks each sink in its
list, in order, with a ``RunState``: the ledger as committed, the decisions, and the loop's counts. A sink
writes what changed since its last tick, and only what it can derive from that state (the ledger is the
truth; nothing reaches a sink that is not committed first). A disk it cannot write it waits out or tries
again at the next tick; it never raises into the loop for that. ``close`` at shutdown, newest sink first.

The sinks, in the order the run ticks them: TensorBoard events (evald.sinks.tensorboard, the ledger's
outbox), the message counters (evald.sinks.counters), the best-checkpoint pointer
(evald.sinks.best_pointer), the control state with its retention leases (evald.sinks.control). The run
summary is written once, at the run's end, not per tick (evald.sinks.summary).

May import: ledger, decisions, sinks.counters (the counts a state carries).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from evald.decisions.decisions import Decisions
from evald.ledger.ledger import Ledger
from evald.sinks.counters import MessageCounts


@dataclass(frozen=True)
class RunState:
    """What a sink may read after a turn: committed state, never the turn's working data."""

    ledger: Ledger
    decisions: Decisions
    run_id: str | None
    lag_policy: str
    final_step: int | None          # the trainer's final step, once RUN_END.json says it
    monitor: str                    # the metric the decisions follow, named in best.json
    messages: MessageCounts         # what the loop did with the messages it got
    longest_load_s: float           # the longest checkpoint read so far (a lease outlasts three)


class Sink(Protocol):
    name: str   # for the log: "closing the <name> failed"

    def tick(self, state: RunState) -> None: ...

    def close(self) -> None: ...
