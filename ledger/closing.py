"""Period close: which period a posting is booked into, and the checksum of a closed period.

Rules:
- a closed period never takes another posting. Anything whose natural period (the month, in
  the ledger's time zone, in which its interval starts) is closed is booked into the next open
  period instead; such a posting is a *prior-period adjustment*, recognisable because its
  `period` differs from `period_label(start_us, zone)`. Budget grants into a closed period are
  refused instead;
- closing records a checksum of the period's postings, which `tally ledger verify` recomputes
  from the sealed segments. Definition (`CHECKSUM_ALGORITHM`): the sha256 of the UTF-8 text made
  of one line per posting booked into the period (`period = P`), ordered by (`txn_id`, `leg`),
  each line the JSON object DuckDB's `to_json` renders of the columns `CHECKSUM_COLUMNS`, in that
  order, followed by `\\n`. The source columns (incarnation, topic, partition, offset) are left
  out, so the checksum depends on what was booked and not on which broker carried it, and
  compaction (which rewrites segment files) does not change it;
- a closed period's record is written once to `segments/closed/<period>.json` and never
  rewritten.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from ledger.periods import Period

CHECKSUM_ALGORITHM = "sha256/jsonl/txn_id,leg/v1"
CHECKSUM_COLUMNS = (
    "txn_id",
    "leg",
    "kind",
    "account",
    "unit",
    "amount",
    "team",
    "project",
    "user",
    "job_id",
    "cost_centre",
    "gpu_uuid",
    "model",
    "pool",
    "node",
    "start_us",
    "end_us",
    "cause",
    "period",
    "util_pct",
    "idle",
)


@dataclass(frozen=True, slots=True)
class ClosedPeriod:
    """A closed period: who closed it, by which event, and the checksum of what it holds."""

    period: str
    event_id: str
    effective_us: int
    actor: str
    reason: str
    rows: int
    sha256: str
    algorithm: str = CHECKSUM_ALGORITHM


def booking_period(natural: str, closed: Collection[str]) -> str:
    """The open period a posting whose natural period is `natural` is booked into."""
    label = natural
    while label in closed:
        label = Period.month(label).next().label
    return label
