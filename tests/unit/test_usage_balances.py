"""Column-built usage moves the balances by exactly what its postings move them by.

The store sums a batch's usage rows per holder or capacity account and period before it
unpivots them into balance movements (`ledger.store.balance_moves`); the postings it inserts are
the rows `USAGE_POSTINGS_SQL` expands. Generated batches (zero and non-zero GPU time, money and
energy, accounts repeated across rows and periods, a batch with no energy at all) must give the
same (account, unit, period) keys — a zero movement still makes its balance row — and the same
amounts both ways.
"""

from __future__ import annotations

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.posting_columns import PostingColumns
from ledger.store.balance_moves import balance_moves
from ledger.store.schema import (
    INCARNATION_PARAMETER,
    USAGE_POSTINGS_SQL,
    usage_to_arrow,
)

ROWS = st.lists(
    st.tuples(
        st.sampled_from(["consumer:vision/detection", "consumer:search/", "unallocated:a/A100"]),
        st.sampled_from(["capacity:a/A100", "capacity:h/H100"]),
        st.sampled_from(["2026-11", "2026-12"]),
        st.integers(0, 10**9),  # GPU-ms
        st.integers(-(10**12), 10**12),  # money (a credit note may be negative)
        st.sampled_from([0, 0, 1, 700_000]),  # energy, often none
    ),
    max_size=40,
)


def _columns(rows: list[tuple[str, str, str, int, int, int]]) -> PostingColumns:
    columns = PostingColumns()
    for n, (account, capacity, period, ms, money, energy) in enumerate(rows):
        columns.add(
            (f"t{n}", "GPU-1", "A100", "a", "node-1", 0, 10, period, 50, "samples", 0, n,
             account, capacity, None, None, None, None, None, ms, money, energy)
        )  # fmt: skip
    return columns


CON = duckdb.connect()  # one for every example: a connection costs more than a query


@settings(max_examples=40, deadline=None)
@given(ROWS)
def test_usage_balances_are_the_sums_of_its_postings(
    rows: list[tuple[str, str, str, int, int, int]],
) -> None:
    _assert_moves_are_the_postings_sums(rows)


def _assert_moves_are_the_postings_sums(rows: list[tuple[str, str, str, int, int, int]]) -> None:
    con = CON
    usage = usage_to_arrow(_columns(rows))
    con.register("usage", usage)
    grouped = "SELECT account, unit, period, sum(amount) FROM ({}) GROUP BY ALL ORDER BY ALL"
    postings = USAGE_POSTINGS_SQL.format(usage="usage", incarnation=INCARNATION_PARAMETER)
    expected = con.execute(grouped.format(postings), {"incarnation": "inc"}).fetchall()
    con.unregister("usage")
    got = sorted(balance_moves(None, usage).to_pylist(), key=lambda r: tuple(r.values()))
    assert [tuple(r.values()) for r in got] == [(a, u, p, int(n)) for a, u, p, n in expected]


BIG = 1 << 62  # a posting's largest amount: sums of a few leave int64, summed in Python then
WIDE = {
    "sums-past-int64-in-between": [
        ("consumer:search/", "capacity:a/A100", "2026-11", 1, BIG, 0),
        ("consumer:search/", "capacity:a/A100", "2026-11", 1, BIG, 0),
        ("consumer:search/", "capacity:a/A100", "2026-11", 1, -BIG, 700_000),
    ],
}


@pytest.mark.parametrize("rows", WIDE.values(), ids=WIDE.keys())
def test_usage_balances_are_exact_where_int64_sums_could_overflow(rows):
    _assert_moves_are_the_postings_sums(rows)
