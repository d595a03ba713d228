"""The writer's in-memory mirror of the projections a fold reads (idle states, GPU assignment
timelines, open holds; the dedupe set is `ledger.store.hot_dedupe`'s). It is read from the hot
tables once, then kept in step by every commit after it succeeded (only the writer changes those
tables), so loading a batch's view costs no query."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ledger.assignments import Holding
from ledger.holds import HoldKey, OpenHold
from ledger.idle import GpuIdleState
from ledger.store.port import StateChanges


@dataclass(slots=True)
class WriterMirror:
    """The writer's in-memory copy of the projections a fold reads."""

    idle: dict[str, GpuIdleState]
    timelines: dict[str, tuple[Holding, ...]]
    holds: dict[HoldKey, OpenHold]

    def apply(self, idle_states: Sequence[GpuIdleState], changes: StateChanges) -> None:
        """What a committed batch changed (the tables changed alike in its transaction)."""
        for state in idle_states:
            self.idle[state.subject] = state
        for gpu, timeline in changes.timelines.items():
            if timeline:
                self.timelines[gpu] = tuple(timeline)
            else:
                self.timelines.pop(gpu, None)
        for hold in changes.holds:
            if hold.amount:
                self.holds[hold.key] = hold
            else:
                self.holds.pop(hold.key, None)
