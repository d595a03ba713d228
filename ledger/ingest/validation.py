"""The check every transaction passes before it is committed: the posting rules
(`ledger.postings.validate`: zero-sum per unit, integer amounts, known units and accounts,
an interval, a cause), amounts a ledger column can hold, and an open booking period.

A transaction that fails is refused as a dead letter naming every problem; it is never
committed, so an unbalanced or out-of-range transaction cannot reach the ledger.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from functools import lru_cache

from ledger.accounts import account_kind
from ledger.events import DeadLetter
from ledger.periods import Period
from ledger.posting_columns import PostingColumns
from ledger.postings import Transaction, validate
from ledger.store.port import SourcedTransaction

# Every amount fits in a signed 64-bit column with room to sum 2 of them; admin amounts are
# bounded at decode (`ledger.admin.MAX_AMOUNT`) to the same limit.
MAX_POSTING_AMOUNT = 1 << 62


def transaction_problems(txn: Transaction, closed: Collection[str]) -> tuple[str, ...]:
    """Every rule `txn` breaks; empty when it may be committed."""
    problems = list(validate(txn))
    for index, posting in enumerate(txn.postings):
        if type(posting.amount) is int and abs(posting.amount) > MAX_POSTING_AMOUNT:
            problems.append(f"posting {index}: amount {posting.amount} is out of range")
    if not _is_period(txn.period):
        problems.append(f"no booking period {txn.period!r}")
    if txn.period in closed:
        problems.append(f"period {txn.period} is closed")
    return tuple(problems)


def check_transaction(txn: Transaction, closed: Collection[str]) -> str | None:
    """Why `txn` is refused, or None."""
    problems = transaction_problems(txn, closed)
    if not problems:
        return None
    return f"transaction {txn.txn_id} refused: " + "; ".join(problems)


def validate_batch(
    items: Sequence[SourcedTransaction], closed: Collection[str]
) -> tuple[list[SourcedTransaction], list[DeadLetter]]:
    """The transactions that may be committed, and a dead letter for each one refused."""
    valid: list[SourcedTransaction] = []
    dead: list[DeadLetter] = []
    for item in items:
        problem = check_transaction(item.txn, closed)
        if problem is None:
            valid.append(item)
            continue
        dead.append(
            DeadLetter(
                reason=problem,
                payload="",
                event_id=item.txn.cause[0] if item.txn.cause else item.txn.txn_id,
                topic=item.topic,
                partition=item.partition,
                offset=item.offset,
            )
        )
    return valid, dead


@lru_cache(maxsize=256)
def _is_period(label: str) -> bool:
    try:
        Period.month(label)
    except ValueError:
        return False
    return True


def validate_columns(columns: PostingColumns, closed: Collection[str]) -> dict[int, str]:
    """The same check over column-built usage transactions: why each refused one (by its
    index) is refused; empty when every one may be committed. Their postings are the holder's
    amounts and the capacity's opposite ones (`PostingColumns`), so they sum to zero per unit
    when every amount is an integer in range; accounts and periods are checked once each."""
    known: dict[str, bool] = {}
    open_period: dict[str, bool] = {}
    problems: dict[int, list[str]] = {}
    for index, row in enumerate(columns.rows):
        txn_id, start, end, period = row[0], row[5], row[6], row[7]
        account, capacity = row[12], row[13]
        found: list[str] = []
        for amount in row[19:22]:
            if type(amount) is not int or abs(amount) > MAX_POSTING_AMOUNT:
                found.append(f"amount {amount!r} is not an integer in range")
        for name in (account, capacity):
            ok = known.get(name)
            if ok is None:
                ok = known[name] = _known_account(name)
            if not ok:
                found.append(f"unknown account {name!r}")
        ok = open_period.get(period)
        if ok is None:
            ok = open_period[period] = _is_period(period) and period not in closed
        if not ok:
            found.append(f"period {period!r} is not open")
        if end <= start or not txn_id:
            found.append("no interval or no cause")
        if found:
            problems[index] = found
    return {
        i: f"transaction {columns.rows[i][0]} refused: " + "; ".join(found)
        for i, found in problems.items()
    }


def _known_account(account: str) -> bool:
    try:
        account_kind(account)
    except ValueError:
        return False
    return True
