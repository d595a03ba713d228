"""Dedupe scopes: which stream of events an applied id belongs to, and when an event not seen
before is too late to deduplicate.

The ledger remembers the ids it applied (events, and the transactions it made of them) for a
window of event time, per scope: a GPU's samples (`gpu:<uuid>`), a job's holds and the hold
transactions derived from them (`job:<job id>`), a GPU's assignment changes (`assign:<uuid>`),
the admin transactions (`admin`, deduplicated for good by the admin log besides). Each scope is
one source's clock, in order: the collector of that GPU, the scheduler for that job or GPU. A
prune forgets a scope's ids older than its newest applied time less the window and records that
cutoff (`forgotten_before`). An event not seen before whose time is before its scope's cutoff
cannot be told apart from one applied and forgotten, so it is refused (`too_late`), never
booked: a resend is never counted twice, however old. A scope's cutoff follows its own newest
event, so a collector that was silent and replays its spool delivers its GPUs' samples after
their cutoff, whatever the rest of the fleet's clock says.
"""

from __future__ import annotations

from ledger.postings import Transaction, TransactionKind

TOO_LATE = "too late to deduplicate"
ADMIN_SCOPE = "admin"
_HOLD_KINDS = (TransactionKind.HOLD, TransactionKind.HOLD_SETTLE, TransactionKind.HOLD_RELEASE)


def sample_scope(gpu_uuid: str) -> str:
    return f"gpu:{gpu_uuid}"


def job_scope(job_id: str) -> str:
    return f"job:{job_id}"


def assignment_scope(gpu_uuid: str) -> str:
    return f"assign:{gpu_uuid}"


def transaction_scope(txn: Transaction) -> str:
    """The scope of a transaction's id: usage is its GPU's, a hold transaction (placed,
    settled, released, expired) its job's, anything else (grants, adjustments, reversals) the
    admin scope."""
    if txn.kind is TransactionKind.USAGE:
        return sample_scope(txn.gpu_uuid)
    if txn.kind in _HOLD_KINDS:
        return job_scope(next((p.job_id for p in txn.postings if p.job_id), ""))
    return ADMIN_SCOPE


def too_late(time_us: int, scope: str, forgotten_before_us: int | None) -> str | None:
    """Why an event not seen before, at `time_us` in `scope`, is refused: its time is before the
    scope's cutoff, so the ledger may have applied it and forgotten; None when it is not."""
    if forgotten_before_us is None or time_us >= forgotten_before_us:
        return None
    return (
        f"{TOO_LATE}: its time {time_us} µs is before {forgotten_before_us} µs, before which "
        f"the ledger no longer keeps the ids it applied for {scope}"
    )
