"""Postings and transactions, and `validate`, the pure check every transaction passes.

A transaction is a set of postings that sums to zero per unit. Amounts are Python ints, never
floats or bools. Dimensions (team, project, user, job) ride on the posting; the GPU and the
interval ride on the transaction. Every transaction names its cause: the ids of the events it
came from.

Allocated-but-idle usage is flagged: a whole GPU's (or MIG slice's) idle usage flags its
transaction (`Transaction.idle`, every leg stored idle); a GPU share's idle usage flags only
that share's legs (`Posting.idle`), since the other shares of the same sample may be busy.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from enum import StrEnum

from ledger.accounts import account_kind
from ledger.errors import TransactionError
from ledger.units import Unit


class TransactionKind(StrEnum):
    USAGE = "usage"
    BUDGET_GRANT = "budget_grant"
    ADJUSTMENT = "adjustment"
    REVERSAL = "reversal"
    HOLD = "hold"
    HOLD_SETTLE = "hold_settle"
    HOLD_RELEASE = "hold_release"


@dataclass(frozen=True, slots=True)
class Posting:
    account: str
    unit: Unit
    amount: int
    team: str | None = None
    project: str | None = None
    user: str | None = None
    job_id: str | None = None
    cost_centre: str | None = None
    idle: bool = False  # a GPU share's allocated-but-idle leg (`ledger.idle_shares`)


@dataclass(frozen=True, slots=True)
class Transaction:
    txn_id: str
    kind: TransactionKind
    start_us: int
    end_us: int
    gpu_uuid: str
    model: str
    pool: str
    node: str
    postings: tuple[Posting, ...]
    cause: tuple[str, ...]
    period: str = ""
    util_pct: int | None = None
    idle: bool = False


def validate(txn: Transaction) -> tuple[str, ...]:
    """Every rule `txn` breaks, as readable messages; empty when the transaction is sound."""
    problems: list[str] = []
    if not txn.postings:
        problems.append("a transaction needs postings")
    if not txn.cause:
        problems.append("a transaction must name the events that caused it")
    if txn.end_us <= txn.start_us:
        problems.append("the interval must end after it starts")
    sums: dict[Unit, int] = defaultdict(int)
    for index, posting in enumerate(txn.postings):
        if type(posting.amount) is not int:
            problems.append(
                f"posting {index}: amount must be an int, not {type(posting.amount).__name__}"
            )
            continue
        if not isinstance(posting.unit, Unit):
            problems.append(f"posting {index}: unknown unit {posting.unit!r}")
            continue
        try:
            account_kind(posting.account)
        except ValueError:
            problems.append(f"posting {index}: unknown account {posting.account!r}")
        sums[posting.unit] += posting.amount
    for unit, total in sums.items():
        if total != 0:
            problems.append(f"postings in {unit} sum to {total}, not zero")
    return tuple(problems)


def check(txn: Transaction) -> Transaction:
    """Return `txn` if it is sound, else raise TransactionError naming every problem."""
    problems = validate(txn)
    if problems:
        raise TransactionError(f"transaction {txn.txn_id}: " + "; ".join(problems))
    return txn
