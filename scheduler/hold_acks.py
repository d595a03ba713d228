"""The scheduler's own holds until the ledger acknowledges them (`HoldAcknowledgements`).

Not the ledger's fold of open holds (`ledger.holds.HoldBook`): this is the scheduler's side of
the hand-over, which decides what the balance handed to the core may count.

Holds are counted once (invariant). A hold is the scheduler's from placement until the ledger
has folded it *and* the scheduler has read a balance that includes it; from then on it is the
ledger's (its `remaining` subtracts what is left of it after metered usage settled part of
it). The core subtracts every open hold of the state from the balance it is given, so the
balance handed to the core is the ledger's `remaining` plus the holds the ledger already
counts: `remaining + Σ acknowledged open holds` (`Dispatcher.balance_of`).

A hold moves along three steps, each only forward:
- published: the broker placed its `HoldPlaced` messages (`placed_at`: partition → offset);
- committed: the ledger's consumer group has committed an offset past every one of them (the
  worker commits offsets only after the DuckDB commit and after publishing the balances that
  commit changed); the `balances` end offsets of that moment become its `barrier`;
- acknowledged: this service's balances consumer has reached the barrier.

A hold the scheduler released that the ledger has not yet released is counted by the ledger
alone (it leaves this book at once). In the acknowledgement window (between the ledger's commit
and this service noticing it, about the worker's offset-commit interval) a hold is counted by
both: the error is on the safe side and lasts seconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from scheduler.model import NO_HOLD, Holds


@dataclass(slots=True)
class HoldTrack:
    """One job's open hold as the scheduler placed it, and whether the ledger counts it yet."""

    team: str
    holds: Holds
    placed_at: dict[int, int] = field(default_factory=dict)  # jobs partition → offset
    messages: int = 0  # HoldPlaced messages of this hold (one per unit)
    barrier: dict[int, int] | None = None  # balances end offsets when the ledger committed it
    acknowledged: bool = False


class HoldAcknowledgements:
    """Open holds per job, placed by the scheduler, and their acknowledgement by the ledger
    (see the module)."""

    def __init__(self) -> None:
        self._open: dict[str, HoldTrack] = {}

    def place(self, job_id: str, team: str, holds: Holds, messages: int) -> None:
        self._open[job_id] = HoldTrack(team, holds, messages=messages)

    def release(self, job_id: str) -> None:
        self._open.pop(job_id, None)

    def published(self, job_id: str, partition: int, offset: int) -> None:
        track = self._open.get(job_id)
        if track is not None:
            previous = track.placed_at.get(partition, -1)
            track.placed_at[partition] = max(previous, offset)

    def awaiting_commit(self) -> list[tuple[str, HoldTrack]]:
        """Holds fully published whose commit by the ledger is not seen yet."""
        return [
            (job, t)
            for job, t in self._open.items()
            if t.barrier is None and not t.acknowledged and t.placed_at
        ]

    def committed(self, committed: Mapping[int, int], barrier: Mapping[int, int]) -> int:
        """Holds whose messages all lie below the ledger's committed offsets get `barrier`."""
        count = 0
        for _, track in self.awaiting_commit():
            if all(committed.get(p, -1) > o for p, o in track.placed_at.items()):
                track.barrier = dict(barrier)
                count += 1
        return count

    def caught_up(self, positions: Mapping[int, int]) -> int:
        """Holds whose barrier the balances consumer has reached are acknowledged."""
        count = 0
        for track in self._open.values():
            if (
                track.barrier is not None
                and not track.acknowledged
                and all(positions.get(p, 0) >= o for p, o in track.barrier.items())
            ):
                track.acknowledged = True
                count += 1
        return count

    def acknowledged(self, team: str) -> Holds:
        total = NO_HOLD
        for track in self._open.values():
            if track.team == team and track.acknowledged:
                total = total + track.holds
        return total

    def unacknowledged(self, team: str) -> Holds:
        total = NO_HOLD
        for track in self._open.values():
            if track.team == team and not track.acknowledged:
                total = total + track.holds
        return total

    def track(self, job_id: str) -> HoldTrack | None:
        return self._open.get(job_id)
