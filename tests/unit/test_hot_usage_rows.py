"""The writer keeps column-built usage as one row per transaction (`usage_rows`), read as its
postings through the `postings` view, and a ledger written before that opens with its hot
postings intact.

A batch of samples whose usage is the common case commits one `usage_rows` row per sample and
no `posting_rows`; the view shows each transaction's four postings (six with energy); the seal
writes those postings out and leaves neither table holding them. A hot database whose
`postings` is still a table (an older writer's) has it renamed to `posting_rows` when the store
opens, so its unsealed postings are read and sealed as before.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from ledger.events import encode_batch
from ledger.ingest import ConsumedMessage, Ingestor
from ledger.pricing import Price, PriceBook
from ledger.store.hot import DuckDBStore
from ledger.store.layout import HOT_DB_NAME
from tests.builders import INTERVAL_US, T0_US, an_envelope

PRICES = PriceBook((Price("*", 3_600_000),))


def _ingest(store: DuckDBStore, samples: int, energy: int | None) -> None:
    envelopes = [
        an_envelope(sample_time_us=T0_US + (n + 1) * INTERVAL_US, energy_delta_mj=energy)
        for n in range(samples)
    ]
    message = ConsumedMessage("tally.samples", 0, 0, encode_batch(envelopes))
    Ingestor(store, "c", PRICES, {}).apply([message])


def _count(store: DuckDBStore, table: str) -> int:
    row = store._con.execute(f"SELECT count(*) FROM {table}").fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize(
    ("energy", "legs"), [(None, 4), (5_000, 6)], ids=["no-energy-4-legs", "energy-6-legs"]
)
def test_common_usage_is_one_row_per_sample_read_as_its_postings(
    tmp_path: Path, energy: int | None, legs: int
) -> None:
    with DuckDBStore(tmp_path) as store:
        _ingest(store, 3, energy)
        assert (_count(store, "usage_rows"), _count(store, "posting_rows")) == (3, 0)
        assert store.hot_rows() == 3 * legs
        sums = store._con.execute(
            "SELECT unit, sum(amount) FROM postings GROUP BY unit ORDER BY unit"
        ).fetchall()
        assert sums and all(total == 0 for _, total in sums)  # each transaction balances
        sealed = store.seal()
        assert sum(s.rows for s in sealed.sealed) == 3 * legs
        assert (_count(store, "usage_rows"), store.hot_rows()) == (0, 0)


def test_an_older_writers_postings_table_is_kept_and_sealed(tmp_path: Path) -> None:
    with DuckDBStore(tmp_path) as store:
        _ingest(store, 2, None)
        # the postings as an older writer kept them: one table, no usage rows
        store._con.execute("CREATE TABLE old_postings AS SELECT * FROM postings")
        store._con.execute("DROP VIEW postings")
        store._con.execute("DROP TABLE usage_rows")
        store._con.execute("DROP TABLE posting_rows")
        store._con.execute("ALTER TABLE old_postings RENAME TO postings")
    con = duckdb.connect(str(tmp_path / HOT_DB_NAME))
    kinds = con.execute(
        "SELECT table_name, table_type FROM information_schema.tables "
        "WHERE table_name IN ('postings', 'posting_rows', 'usage_rows')"
    ).fetchall()
    con.close()
    assert kinds == [("postings", "BASE TABLE")]
    with DuckDBStore(tmp_path) as store:
        assert (_count(store, "posting_rows"), store.hot_rows()) == (8, 8)
        assert sum(s.rows for s in store.seal().sealed) == 8
        assert store.hot_rows() == 0
