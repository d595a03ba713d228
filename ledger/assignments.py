"""GPU assignments: who the scheduler says holds each GPU, over time.

The scheduler publishes `GpuAssigned` / `GpuReleased` (ledger.job_events) keyed by GPU UUID. The
ledger keeps each GPU's timeline as `Holding`s — half-open `[from_us, to_us)`, `to_us` None while
still held — and attribution asks it who held a GPU over a sample's interval when the sample
itself names no owner (ownership precedence: the sample's owner, then the scheduler's assignment
at that time, then unallocated).

Invariants: a GPU's whole holdings never overlap (a new assignment ends the previous one); a release
ends only the holding of the job it names. A GPU share (`Holding.share`, per-mille of the GPU,
`ledger.fractional`) lies in the timeline of the GPU it is a share of, beside the other shares:
assigning one ends no other holding (the scheduler never runs a whole-GPU job and shares on one
GPU at once), and `owners_over` passes shares over — `shares_over` reads them. A timeline
remembers ended holdings for `HOLDING_MEMORY_US` before its newest change (`forget_before`),
long enough for any sample the ledger still deduplicates to find its owner.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from ledger.events import Owner

HOLDING_MEMORY_US = 31 * 24 * 3600 * 1_000_000


@dataclass(frozen=True, slots=True)
class Holding:
    gpu_uuid: str
    owner: Owner
    from_us: int
    to_us: int | None = None
    share: int | None = None  # per-mille of the GPU for a share; None: the whole GPU

    def overlap(self, start_us: int, end_us: int) -> tuple[int, int] | None:
        lo = max(start_us, self.from_us)
        hi = end_us if self.to_us is None else min(end_us, self.to_us)
        return (lo, hi) if lo < hi else None


@dataclass(frozen=True, slots=True)
class OwnedPiece:
    """Part of an interval and who held the GPU over it (None: nobody); `share`: the per-mille
    of the GPU a share holder held over it (None: the whole GPU)."""

    start_us: int
    end_us: int
    owner: Owner | None
    share: int | None = None


def assign(timeline: Sequence[Holding], holding: Holding) -> tuple[Holding, ...]:
    """`timeline` with `holding` added: an open holding that started before it ends there (for a
    share: only the same job's open holding)."""
    kept: list[Holding] = []
    for old in timeline:
        ends = old.to_us is None and old.from_us <= holding.from_us
        if holding.share is not None:
            ends = ends and old.owner.job_id == holding.owner.job_id
        h = replace(old, to_us=holding.from_us) if ends else old
        if h.to_us is not None and h.to_us <= h.from_us:
            continue
        kept.append(h)
    kept.append(holding)
    return tuple(sorted(kept, key=lambda h: h.from_us))


def release(timeline: Sequence[Holding], job_id: str, at_us: int) -> tuple[Holding, ...]:
    """`timeline` with the open holding of `job_id` ended at `at_us`."""
    return tuple(
        replace(h, to_us=at_us)
        if h.to_us is None and h.owner.job_id == job_id and h.from_us <= at_us
        else h
        for h in timeline
    )


def owners_over(timeline: Sequence[Holding], start_us: int, end_us: int) -> list[OwnedPiece]:
    """Who held the whole GPU over `[start_us, end_us)`, as consecutive pieces covering all of
    it (shares left out: see `shares_over`)."""
    pieces: list[OwnedPiece] = []
    cursor = start_us
    for h in sorted(timeline, key=lambda h: h.from_us):
        if h.share is not None:
            continue
        span = h.overlap(start_us, end_us)
        if span is None:
            continue
        lo, hi = span
        if lo > cursor:
            pieces.append(OwnedPiece(cursor, lo, None))
        pieces.append(OwnedPiece(max(lo, cursor), hi, h.owner))
        cursor = max(cursor, hi)
    if cursor < end_us:
        pieces.append(OwnedPiece(cursor, end_us, None))
    return [p for p in pieces if p.end_us > p.start_us]


def shares_over(timeline: Sequence[Holding], start_us: int, end_us: int) -> list[OwnedPiece]:
    """The shares of the GPU held over `[start_us, end_us)`: one piece per share holding that
    overlaps it, with its per-mille, in the order they began (the job id among equals)."""
    pieces: list[OwnedPiece] = []
    for h in sorted(
        (h for h in timeline if h.share is not None),
        key=lambda h: (h.from_us, h.owner.job_id or ""),
    ):
        span = h.overlap(start_us, end_us)
        if span is not None:
            pieces.append(OwnedPiece(span[0], span[1], h.owner, h.share))
    return pieces


def forget_before(timeline: Sequence[Holding], cutoff_us: int) -> tuple[Holding, ...]:
    """`timeline` without the holdings that ended at or before `cutoff_us`."""
    return tuple(h for h in timeline if h.to_us is None or h.to_us > cutoff_us)


def main_holder(pieces: Sequence[OwnedPiece]) -> Owner | None:
    """Who held the GPU longest over `pieces` (the earliest of equals; None: nobody held it)."""
    by_holder: dict[Owner, int] = {}
    for piece in pieces:
        if piece.owner is not None:
            by_holder[piece.owner] = by_holder.get(piece.owner, 0) + piece.end_us - piece.start_us
    return max(by_holder, key=lambda owner: by_holder[owner]) if by_holder else None
