"""The ledger store against a real DuckDB file and real Parquet segments."""

import json

import pytest

from ledger.events import encode_batch
from ledger.ingest import ConsumedMessage, Ingestor
from ledger.pricing import Price, PriceBook
from ledger.read.queries import LedgerQueries
from ledger.store.hot import DuckDBStore
from ledger.store.rollup_files import LEVELS
from ledger.store.segments import Manifest
from ledger.store.verify import verify_ledger
from tests.builders import INTERVAL_US, T0_US, a_process, an_envelope, an_owner

PRICES = PriceBook((Price("*", 3_600_000),))  # one micro per GPU-ms
INC = "cluster-a"
TOPIC = "samples"


def message(offset, *times, partition=0, gpu="GPU-1", value=None):
    envelopes = [
        an_envelope(
            gpu_uuid=gpu,
            sample_time_us=T0_US + t * INTERVAL_US,
            processes=(a_process(owner=an_owner()),),
        )
        for t in times
    ]
    return ConsumedMessage(
        TOPIC, partition, offset, value if value is not None else encode_batch(envelopes)
    )


@pytest.fixture
def store(tmp_path):
    with DuckDBStore(tmp_path / "ledger") as s:
        yield s


def ingest(store, *messages, incarnation=INC):
    return Ingestor(store, incarnation, PRICES, {"vision": "research"}).apply(list(messages))


def sealed_totals(store):
    q = LedgerQueries(store.data_dir)
    return q.transaction_count(), q.totals_by_unit()


def test_commit_records_postings_offsets_and_seals(store):
    result = ingest(store, message(0, 1, 2), message(1, 3))
    assert (result.samples, result.commit.transactions, result.commit.postings) == (3, 3, 12)
    assert store.applied_offsets(INC) == {(TOPIC, 0): 2}
    store.seal()
    assert store.hot_rows() == 0
    assert sealed_totals(store) == (3, {"gpu_ms": 30_000, "money_micros": 30_000})
    assert verify_ledger(store.data_dir).ok


def test_redelivered_offsets_are_skipped(store):
    ingest(store, message(0, 1), message(1, 2))
    again = ingest(store, message(0, 1), message(1, 2), message(2, 3))
    assert again.skipped_messages == 2
    assert again.commit.transactions == 1
    store.seal()
    assert sealed_totals(store)[0] == 3


def test_duplicate_events_are_dropped_by_id(store):
    first = ingest(store, message(0, 1, 2))
    assert first.commit.transactions == 2
    resent = ingest(store, message(1, 2, 3, 3))  # a resend of 2, and 3 twice in one message
    assert (resent.commit.transactions, resent.commit.duplicates) == (1, 2)
    store.seal()
    assert sealed_totals(store)[0] == 3
    assert verify_ledger(store.data_dir).ok


def test_a_new_broker_incarnation_starts_offsets_afresh(store):
    ingest(store, message(0, 1), message(1, 2))
    fresh = ingest(store, message(0, 10), message(1, 11), incarnation="cluster-b")
    assert fresh.skipped_messages == 0
    assert fresh.commit.transactions == 2
    store.seal()
    assert sealed_totals(store)[0] == 4
    report = verify_ledger(store.data_dir)
    assert report.ok, report.problems
    assert {s.incarnation for s in Manifest(store.segments_root).load()} == {
        "cluster-a",
        "cluster-b",
    }


def test_bad_messages_become_dead_letters_and_their_offsets_are_applied(store):
    result = ingest(store, message(0, 1), message(1, value=b"garbage"), message(2, 2))
    assert len(result.dead_letters) == 1
    assert result.dead_letters[0].offset == 1
    assert store.applied_offsets(INC) == {(TOPIC, 0): 3}
    assert [row[2] for row in store.dead_letters()] == [1]
    store.seal()
    assert verify_ledger(store.data_dir).ok  # the range 0-2 is covered, no gap


def test_unpriced_model_is_a_dead_letter(store):
    prices = PriceBook((Price("A100", 1),))
    result = Ingestor(store, INC, prices, {}).apply([message(0, 1)])
    assert result.commit.transactions == 0
    assert "no price" in result.dead_letters[0].reason


def test_a_failed_commit_leaves_nothing_behind(store, monkeypatch):
    ingest(store, message(0, 1))

    def explode(*_args, **_kwargs):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr("ledger.store.hot._postings_table", explode)
    with pytest.raises(RuntimeError):
        ingest(store, message(1, 2))
    assert store.applied_offsets(INC) == {(TOPIC, 0): 1}
    monkeypatch.undo()
    assert ingest(store, message(1, 2)).commit.transactions == 1


def test_state_survives_reopening(tmp_path):
    with DuckDBStore(tmp_path / "l") as store:
        ingest(store, message(0, 1), message(1, 2))
    with DuckDBStore(tmp_path / "l") as store:
        assert store.applied_offsets(INC) == {(TOPIC, 0): 2}
        assert ingest(store, message(1, 2)).skipped_messages == 1
        assert ingest(store, message(2, 1)).commit.duplicates == 1


def test_resealing_after_a_crash_rewrites_the_same_file(store):
    ingest(store, message(0, 1), message(1, 2))
    groups = store._con.execute(
        'SELECT incarnation, topic, "partition", min(first_offset), max(last_offset) '
        "FROM source_ranges GROUP BY ALL"
    ).fetchall()
    # a crash after the segment file was written, before the manifest or the store knew
    first = store._segments.write_segment(*groups[0])
    assert Manifest(store.segments_root).load() == []
    result = store.seal()
    assert [s.path for s in result.sealed] == [first.path]
    assert result.sealed[0].sha256 == first.sha256
    assert verify_ledger(store.data_dir).ok


def test_small_segments_are_compacted_without_changing_totals(store):
    for offset in range(10):
        ingest(store, message(offset, offset + 1))
        store.seal(compact_min_segments=100)
    assert len(Manifest(store.segments_root).load()) == 10
    before = sealed_totals(store)
    result = store.seal(compact_min_segments=4)
    segments = Manifest(store.segments_root).load()
    assert len(result.compacted) == 1
    assert [(s.first_offset, s.last_offset) for s in segments] == [(0, 9)]
    assert sealed_totals(store) == before
    assert verify_ledger(store.data_dir).ok
    assert len(list(store.segments_root.rglob("*.parquet"))) == 1 + len(LEVELS)  # and rollups


def test_sealed_segments_are_ordered_by_partition_and_offset(store):
    ingest(
        store, message(0, 1, partition=1), message(0, 2, partition=0), message(1, 3, partition=1)
    )
    store.seal()
    segments = Manifest(store.segments_root).load()
    assert [(s.partition, s.first_offset, s.last_offset) for s in segments] == [
        (0, 0, 0),
        (1, 0, 1),
    ]
    assert all("/p0001/" in s.path or "/p0000/" in s.path for s in segments)


def test_seen_events_outside_the_window_are_pruned(store):
    ingest(store, message(0, 1), message(1, 1000))
    assert store.prune_seen_events(window_us=10 * INTERVAL_US) == 1
    assert ingest(store, message(2, 1000)).commit.duplicates == 1


class TestVerifyFindsDamage:
    def _sealed(self, store):
        ingest(store, message(0, 1), message(1, 2))
        store.seal()
        ingest(store, message(2, 3))
        store.seal()
        return Manifest(store.segments_root)

    def test_a_changed_segment(self, store):
        manifest = self._sealed(store)
        path = store.segments_root / manifest.load()[0].path
        path.write_bytes(path.read_bytes()[:-10] + b"0123456789")
        report = verify_ledger(store.data_dir)
        assert any("checksum does not match" in p for p in report.problems)

    def test_a_missing_segment(self, store):
        manifest = self._sealed(store)
        (store.segments_root / manifest.load()[0].path).unlink()
        assert any("missing" in p for p in verify_ledger(store.data_dir).problems)

    def test_an_offset_gap(self, store):
        manifest = self._sealed(store)
        doc = json.loads(manifest.path.read_text())
        doc["segments"][0]["last_offset"] = 0
        manifest.path.write_text(json.dumps(doc))
        problems = verify_ledger(store.data_dir).problems
        assert any("offsets 1-1 are missing" in p for p in problems), problems

    def test_a_range_sealed_twice(self, store):
        manifest = self._sealed(store)
        doc = json.loads(manifest.path.read_text())
        doc["segments"][1]["first_offset"] = 1
        manifest.path.write_text(json.dumps(doc))
        problems = verify_ledger(store.data_dir).problems
        assert any("sealed twice" in p for p in problems), problems

    def test_a_transaction_in_two_segments(self, store):
        manifest = self._sealed(store)
        segments = manifest.load()
        a, b = (store.segments_root / s.path for s in segments)
        b.write_bytes(a.read_bytes())
        doc = json.loads(manifest.path.read_text())
        doc["segments"][1]["sha256"] = doc["segments"][0]["sha256"]
        doc["segments"][1]["rows"] = doc["segments"][0]["rows"]
        manifest.path.write_text(json.dumps(doc))
        problems = verify_ledger(store.data_dir).problems
        assert any("appears in 2 segments" in p for p in problems), problems
        assert any("outside the segment's source range" in p for p in problems), problems

    def test_an_unbalanced_transaction(self, store):
        manifest = self._sealed(store)
        seg = manifest.load()[0]
        path = store.segments_root / seg.path
        import duckdb

        con = duckdb.connect()
        tmp = path.with_suffix(".tmp")
        con.execute(
            f"COPY (SELECT * REPLACE (CASE WHEN leg = 0 THEN amount + 1 ELSE amount END AS amount)"
            f" FROM read_parquet('{path}')) TO '{tmp}' (FORMAT parquet)"
        )
        tmp.replace(path)
        from ledger.store.segments import file_sha256

        doc = json.loads(manifest.path.read_text())
        doc["segments"][0]["sha256"] = file_sha256(path)
        manifest.path.write_text(json.dumps(doc))
        problems = verify_ledger(store.data_dir).problems
        assert any("not zero" in p for p in problems), problems
