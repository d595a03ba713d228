"""The period checksum `ledger.closing` defines, computed in pure Python for the in-memory
store (`MemoryStore`): the same lines DuckDB's `to_json` renders for the DuckDB store."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable

from ledger.closing import CHECKSUM_COLUMNS
from ledger.postings import Transaction


def checksum_lines(transactions: Iterable[Transaction], period: str) -> list[str]:
    """The lines `ledger.closing`'s checksum is the sha256 of, for the postings of
    `transactions` booked into `period`: one compact JSON object per posting, columns in
    `CHECKSUM_COLUMNS` order, sorted by (txn_id, leg), as DuckDB's `to_json` renders them."""
    rows: list[tuple[str, int, str]] = []
    for txn in transactions:
        if txn.period != period:
            continue
        for leg, p in enumerate(txn.postings):
            values = (
                txn.txn_id,
                leg,
                txn.kind.value,
                p.account,
                p.unit.value,
                p.amount,
                p.team,
                p.project,
                p.user,
                p.job_id,
                p.cost_centre,
                txn.gpu_uuid or None,  # stored NULL when empty (`transactions_to_arrow`)
                txn.model or None,
                txn.pool or None,
                txn.node or None,
                txn.start_us,
                txn.end_us,
                " ".join(txn.cause),
                txn.period,
                txn.util_pct,
                txn.idle or p.idle,  # a share's idle legs (`transactions_to_arrow`)
            )
            line = json.dumps(
                dict(zip(CHECKSUM_COLUMNS, values, strict=True)),
                separators=(",", ":"),
                ensure_ascii=False,
            )
            rows.append((txn.txn_id, leg, line))
    rows.sort(key=lambda r: (r[0].encode(), r[1]))  # DuckDB orders text by its bytes
    return [line for _, _, line in rows]


def period_checksum(transactions: Iterable[Transaction], period: str) -> tuple[int, str]:
    """(rows, sha256) of the postings of `transactions` booked into `period`."""
    lines = checksum_lines(transactions, period)
    digest = hashlib.sha256("".join(f"{line}\n" for line in lines).encode())
    return len(lines), digest.hexdigest()
