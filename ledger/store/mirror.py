"""The writer's in-memory mirrors of what a fold reads: the dedupe set (applied event ids) and
the projections (idle states, GPU assignment timelines, open holds). Each is read from its hot
table once, then kept in step by every commit and prune after it succeeded (only the writer
changes those tables), so deduplicating a batch is one set operation and loading its view costs
no query."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import duckdb

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


class DedupeSet:
    """The ids in `seen_events` and their greatest dedupe time."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self._con = con
        self._ids: set[str] | None = None
        self._newest: int | None = None

    def ids(self) -> set[str]:
        if self._ids is None:
            rows = self._con.execute("SELECT event_id, time_us FROM seen_events").fetchall()
            self._ids = {str(r[0]) for r in rows}
            self._newest = max((int(r[1]) for r in rows), default=None)
        return self._ids

    def newest(self) -> int | None:
        self.ids()
        return self._newest

    def added(self, ids: Sequence[str], times: Sequence[int]) -> None:
        """Ids a commit recorded, with their dedupe times."""
        if self._ids is None or not ids:
            return
        self._ids.update(ids)
        newest = max(times)
        self._newest = newest if self._newest is None else max(newest, self._newest)

    def forgotten(self, ids: Iterable[str]) -> None:
        """Ids a prune deleted."""
        if self._ids is not None:
            self._ids.difference_update(ids)
