"""The raw-event archive and `tally ledger rebuild`: every consumed message is archived with its
batch and sealed with its range, and replaying the archive reproduces the live ledger."""

from __future__ import annotations

import json

import duckdb
import orjson
import pytest
from click.testing import CliRunner

from ledger.admin import (
    AdjustmentRecorded,
    BudgetGranted,
    PeriodClosed,
    PriceSet,
    admin_envelope,
    admin_envelope_to_dict,
)
from ledger.events import encode_batch
from ledger.holds import HoldPlaced, HoldReleased, encode_hold, hold_envelope
from ledger.ingest import ConsumedMessage, Ingestor, InputTopics, OutputTopics
from ledger.job_events import FailReason, JobFailed, JobSpec, JobSubmitted, encode_job_event
from ledger.store.hot import DuckDBStore
from ledger.store.rebuild import (
    ArchivedBatch,
    DifferenceKind,
    ReplaySettings,
    archive_batches,
    batches_from_messages,
    compare,
    rebuild,
    sealed_snapshot,
)
from ledger.store.rollup_files import LEVELS
from ledger.store.schema import archived_value
from ledger.store.segments import Manifest, file_sha256
from ledger.store.side_files import AUDIT_NAME
from ledger.store.verify import archive_coverage, verify_ledger
from ledger.units import Unit
from tally.cli import cli
from tally.cli.ledger_checks import replay_settings
from tally.config import parse_config
from tests.builders import (
    INTERVAL_US,
    T0_US,
    a_config_dict,
    a_mig,
    a_process,
    an_envelope,
    an_owner,
)
from tests.conftest import write_config
from tests.unit.test_segment_rollups import postings_folded, rollups_folded

CONFIG = parse_config(a_config_dict(), "test")
SETTINGS = replay_settings(CONFIG)
SAMPLES, ADMIN, JOBS = CONFIG.topics.samples, CONFIG.topics.admin, CONFIG.topics.jobs
DEC_US = T0_US + 30 * 86_400_000_000
META = ("alice", "test", DEC_US + 3_600_000_000)


def usage(minute, gpu="GPU-1", team="vision", job="job-1", **extra):
    return an_envelope(
        gpu_uuid=gpu,
        sample_time_us=T0_US + minute * INTERVAL_US,
        processes=(a_process(owner=an_owner(team, "detection", "ada", job)),),
        **extra,
    )


def admin_value(*events):
    return orjson.dumps([admin_envelope_to_dict(admin_envelope(e)) for e in events])


class Feed:
    """One writer fed like the worker feeds it: offsets per partition, one incarnation at a time."""

    def __init__(self, store, incarnation="cluster-a"):
        self.store = store
        self.offsets: dict[tuple[str, int], int] = {}
        self.switch(incarnation)

    def switch(self, incarnation):
        self.offsets = {}
        self.ingestor = Ingestor(
            self.store,
            incarnation,
            SETTINGS.prices,
            SETTINGS.cost_centres,
            SETTINGS.idle_policy,
            OutputTopics(balances=CONFIG.topics.balances),
            SETTINGS.inputs,
        )

    def message(self, topic, value, partition=0, key=None):
        offset = self.offsets.get((topic, partition), 0)
        self.offsets[(topic, partition)] = offset + 1
        return ConsumedMessage(topic, partition, offset, value, key)

    def samples(self, *envelopes, partition=0):
        gpu = envelopes[0].subject.encode() if envelopes else None
        return self.message(SAMPLES, encode_batch(envelopes), partition, gpu)

    def admin(self, *events):
        return self.message(ADMIN, admin_value(*events), key=b"admin")

    def hold(self, event):
        key, value = encode_hold(hold_envelope(event))
        return self.message(JOBS, value, key=key)

    def job(self, event):
        return self.message(JOBS, encode_job_event(event, "tally://scheduler"), key=b"job-1")

    def apply(self, *messages):
        return self.ingestor.apply(list(messages))


SPEC = JobSpec("job-1", "vision", "detection", "ada", "dev", 1, T0_US, 3_600_000_000)


def build_live(store):
    """Usage on whole GPUs and a MIG slice, grants, an adjustment, a reversal, holds placed,
    settled and released, a price change, a resend, garbage, November closed, late usage,
    and a second broker incarnation."""
    feed = Feed(store)
    feed.apply(
        feed.admin(
            BudgetGranted("vision", "2026-11", Unit.MONEY, 50_000_000, *META),
            BudgetGranted("language", "2026-11", Unit.GPU_MS, 9_000_000, *META),
        ),
        feed.job(JobSubmitted(SPEC, T0_US, requested_by="team:vision", client="10.1.2.3")),
        feed.hold(HoldPlaced("job-1", "vision", "detection", Unit.GPU_MS, 25_000, DEC_US, T0_US)),
        feed.samples(usage(1), usage(2), partition=0),
        feed.samples(usage(1, gpu="GPU-2", team="language", job="job-2"), partition=1),
    )
    feed.apply(
        feed.samples(usage(3), usage(2)),  # 2 is a resend
        feed.message(SAMPLES, b"{not json", partition=1),
        feed.samples(usage(2, gpu="GPU-3", job=None, mig=a_mig()), partition=1),
    )
    feed.apply(
        feed.admin(
            AdjustmentRecorded("consumer:vision/detection", Unit.MONEY, -1_000, "2026-11", *META),
            AdjustmentRecorded.reversal(usage(1, gpu="GPU-2").id, *META),
            PriceSet("NVIDIA H100 80GB HBM3", None, 4_000_000, *META[:2], T0_US + 5 * INTERVAL_US),
        )
    )
    cancelled = JobFailed(
        "job-1", FailReason.CANCELLED, 1, False, T0_US + 1, None, "", None, "admin"
    )
    feed.apply(
        feed.samples(usage(6), usage(7)),
        feed.job(cancelled),
        feed.hold(HoldReleased("job-1", T0_US + 1)),
    )
    store.seal(compact_min_segments=2)
    feed.apply(feed.admin(PeriodClosed("2026-11", *META)))
    feed.switch("cluster-b")  # the broker restarted empty: offsets from 0 again
    feed.apply(feed.samples(usage(8)), feed.samples(usage(9, gpu="GPU-2"), partition=1))
    feed.apply(feed.admin(BudgetGranted("vision", "2026-12", Unit.MONEY, 7, *META)))
    store.seal()
    return feed


@pytest.fixture
def live(tmp_path):
    with DuckDBStore(tmp_path / "live") as store:
        build_live(store)
        yield store


def archived_rows(data_dir):
    """Every archived message: (batch, position, incarnation, topic, partition, offset, key,
    value as consumed)."""
    files = Manifest(data_dir / "archive").files()
    listed = ", ".join(f"'{f}'" for f in files)
    rows = (
        duckdb.connect()
        .execute(
            'SELECT batch_seq, batch_index, incarnation, topic, "partition", "offset", "key", '
            f'"value", value_codec, value_size FROM read_parquet([{listed}]) '
            "ORDER BY batch_seq, batch_index"
        )
        .fetchall()
    )
    return [(*r[:7], archived_value(*r[7:])) for r in rows]


# ---------------------------------------------------------------------------- the archive


def test_each_commit_archives_its_messages_in_order_as_one_batch(tmp_path):
    with DuckDBStore(tmp_path / "l") as store:
        feed = Feed(store)
        grant = feed.admin(BudgetGranted("vision", "2026-11", Unit.MONEY, 5, *META))
        first, second = feed.samples(usage(1)), feed.samples(usage(2), partition=1)
        feed.apply(second, grant, first)  # one call: an admin batch, then a samples batch
        assert (store.batch_seq, store.hot_archived()) == (2, 3)
        again = feed.apply(second, feed.samples(usage(3), partition=1))
        assert again.skipped_messages == 1  # redelivered: neither applied nor archived again
        assert (store.batch_seq, store.hot_archived()) == (3, 4)
        store.seal()
        assert store.hot_archived() == 0
        rows = archived_rows(store.data_dir)
    assert [(r[0], r[1], r[3], r[4], r[5]) for r in rows] == [
        (1, 0, ADMIN, 0, 0),
        (2, 0, SAMPLES, 1, 0),  # the batch's own order, not offset order
        (2, 1, SAMPLES, 0, 0),
        (3, 0, SAMPLES, 1, 1),
    ]
    assert rows[1][6:] == (second.key, second.value)


def test_large_values_are_archived_compressed_and_come_back_whole(tmp_path):
    with DuckDBStore(tmp_path / "l") as store:
        feed = Feed(store)
        packed = feed.samples(*[usage(minute) for minute in range(1, 31)])  # a backfill message
        small = feed.samples(usage(40))
        feed.apply(packed, small)
        stored = store._con.execute(
            "SELECT value_codec, value_size, octet_length(value) FROM raw_events ORDER BY 1"
        ).fetchall()
        store.seal()
        data_dir = store.data_dir
    assert stored[0][:2] == ("zstd", len(packed.value)) and stored[0][2] < len(packed.value) / 4
    assert stored[1] == (None, None, len(small.value))
    assert [r[7] for r in archived_rows(data_dir)] == [packed.value, small.value]
    (batch,) = archive_batches(data_dir)
    assert [m.value for m in batch.messages] == [packed.value, small.value]


def test_the_archive_is_sealed_with_the_postings_ranges(live):
    postings = Manifest(live.segments_root).load()
    archive = Manifest(live.archive_root).load()
    assert archive and archive_coverage(postings, archive) == ()
    assert {s.incarnation for s in archive} == {"cluster-a", "cluster-b"}
    assert all(s.path.endswith(".parquet") and not s.path.startswith("/") for s in archive)
    report = verify_ledger(live.data_dir)
    assert report.ok, report.problems
    assert report.archive_segments == len(archive)
    assert report.archived_messages == sum(s.rows for s in archive) == 16
    assert report.audit_records == 9


def test_a_failed_commit_archives_nothing(tmp_path, monkeypatch):
    with DuckDBStore(tmp_path / "l") as store:
        feed = Feed(store)
        feed.apply(feed.samples(usage(1)))

        def explode(*_args, **_kwargs):
            raise RuntimeError("disk on fire")

        monkeypatch.setattr(store, "_apply_changes", explode)
        with pytest.raises(RuntimeError):
            feed.apply(feed.samples(usage(2)))
        assert (store.batch_seq, store.hot_archived()) == (1, 1)
        monkeypatch.undo()
    with DuckDBStore(tmp_path / "l") as store:  # the batch is redelivered after a restart
        assert store.batch_seq == 1
        feed = Feed(store)
        feed.offsets[(SAMPLES, 0)] = 1
        assert feed.apply(feed.samples(usage(2))).commit.transactions == 1
        assert (store.batch_seq, store.hot_archived()) == (2, 2)


def test_archive_segments_are_compacted_and_checked(tmp_path):
    with DuckDBStore(tmp_path / "l") as store:
        feed = Feed(store)
        for minute in range(1, 11):
            feed.apply(feed.samples(usage(minute)))
            store.seal(compact_min_segments=100)
        assert len(store.archive_manifest.load()) == 10
        result = store.seal(compact_min_segments=4)
        assert len(result.archive_compacted) == 1
        assert [(s.first_offset, s.last_offset, s.rows) for s in store.archive_manifest.load()] == [
            (0, 9, 10)
        ]
        assert len(list(store.archive_root.rglob("*.parquet"))) == 1
        assert verify_ledger(store.data_dir).ok


class TestVerifyFindsArchiveDamage:
    def test_a_missing_archive_range(self, live):
        manifest = live.archive_manifest
        doc = json.loads(manifest.path.read_text())
        gone = doc["segments"].pop(0)
        manifest.path.write_text(json.dumps(doc))
        (live.archive_root / gone["path"]).unlink()
        problems = verify_ledger(live.data_dir).problems
        assert any("sealed but not archived" in p for p in problems), problems

    def test_a_changed_archive_segment(self, live):
        seg = live.archive_manifest.load()[0]
        path = live.archive_root / seg.path
        path.write_bytes(path.read_bytes()[:-8] + b"01234567")
        problems = verify_ledger(live.data_dir).problems
        assert any(p.startswith("archive: ") and "checksum" in p for p in problems), problems

    def test_a_message_missing_inside_an_archived_range(self, live):
        seg = next(s for s in live.archive_manifest.load() if s.rows > 1)
        path = live.archive_root / seg.path
        tmp = path.with_suffix(".tmp")
        duckdb.connect().execute(
            f"COPY (SELECT * FROM read_parquet('{path}') WHERE \"offset\" > {seg.first_offset}) "
            f"TO '{tmp}' (FORMAT parquet)"
        )
        tmp.replace(path)
        doc = json.loads(live.archive_manifest.path.read_text())
        entry = next(e for e in doc["segments"] if e["path"] == seg.path)
        entry.update(sha256=file_sha256(path), rows=seg.rows - 1)
        live.archive_manifest.path.write_text(json.dumps(doc))
        problems = verify_ledger(live.data_dir).problems
        assert any(
            f"offset {seg.first_offset} of {seg.topic}[{seg.partition}]" in p
            and "its message is not archived" in p
            for p in problems
        ), problems

    def test_a_range_archived_twice(self, live):
        manifest = live.archive_manifest
        doc = json.loads(manifest.path.read_text())
        twice = dict(doc["segments"][0], path="copy.parquet")
        (live.archive_root / "copy.parquet").write_bytes(
            (live.archive_root / doc["segments"][0]["path"]).read_bytes()
        )
        doc["segments"].append(twice)
        manifest.path.write_text(json.dumps(doc))
        problems = verify_ledger(live.data_dir).problems
        assert any("archive: " in p and "sealed twice" in p for p in problems), problems
        assert any("archived 2 times" in p for p in problems), problems


# ---------------------------------------------------------------------------- rebuild


def test_rebuild_equals_live(live, tmp_path):
    report = rebuild(live.data_dir, tmp_path / "rebuilt", SETTINGS)
    assert report.differences == ()
    assert (report.batches, report.messages) == (live.batch_seq, 16)
    rebuilt = sealed_snapshot(tmp_path / "rebuilt")
    # the audit trail, record for record: grants, adjustment, reversal, price, the job's
    # submission and cancellation, the close and the December grant
    assert rebuilt.audit == sealed_snapshot(live.data_dir).audit == tuple(live.audit_records())
    kinds = [r.entry.kind for r in rebuilt.audit]
    assert kinds.count("job.submit") == kinds.count("job.cancel") == 1
    assert len(kinds) == 9, kinds
    assert set(rebuilt.closed) == {"2026-11"}
    assert rebuilt.balances == {
        (r.account, r.unit, r.period): r.balance for r in live.balance_rows()
    }
    assert verify_ledger(tmp_path / "rebuilt").ok  # each rollup equals its segment's postings
    # the rebuilt ledger is cut into other segments, so its rollups are cut otherwise too, but
    # they sum to the same groups as the live ones and as the postings
    for level in LEVELS:
        rolled = rollups_folded(tmp_path / "rebuilt", level)
        assert rolled == rollups_folded(live.data_dir, level)
        assert rolled == postings_folded(tmp_path / "rebuilt", level)


def test_replay_is_deterministic(live, tmp_path):
    one = rebuild(live.data_dir, tmp_path / "one", SETTINGS)
    two = rebuild(live.data_dir, tmp_path / "two", SETTINGS)
    assert one.identical and two.identical
    assert compare(sealed_snapshot(tmp_path / "one"), sealed_snapshot(tmp_path / "two")) == ()
    # the rebuilt ledgers archive the same batches again, message for message
    assert archived_rows(tmp_path / "one") == archived_rows(tmp_path / "two")
    assert archived_rows(tmp_path / "one") == archived_rows(live.data_dir)


def test_a_rebuild_never_writes_into_a_ledger(live, config_path, tmp_path):
    from ledger.errors import StoreError

    assert rebuild(live.data_dir, tmp_path / "elsewhere", SETTINGS).identical
    with pytest.raises(StoreError, match="not an empty directory"):
        rebuild(live.data_dir, tmp_path / "elsewhere", SETTINGS)
    before = sorted(p.name for p in live.data_dir.iterdir())
    result = CliRunner().invoke(
        cli,
        ["ledger", "rebuild", "--config", str(config_path), "--into", str(live.data_dir)],
    )
    assert result.exit_code == 2, result.output
    assert "not an empty directory" in result.output
    assert sorted(p.name for p in live.data_dir.iterdir()) == before


def test_a_tampered_live_segment_is_a_difference(live, tmp_path):
    seg = Manifest(live.segments_root).load()[0]
    path = live.segments_root / seg.path
    con = duckdb.connect()
    tmp = path.with_suffix(".tmp")
    con.execute(  # both legs of money moved by one: still zero-sum, a subtle forgery
        f"COPY (SELECT * REPLACE (CASE WHEN unit = 'money_micros' THEN amount * 2 "
        f"ELSE amount END AS amount) FROM read_parquet('{path}')) TO '{tmp}' (FORMAT parquet)"
    )
    tmp.replace(path)
    doc = json.loads(live.manifest.path.read_text())
    doc["segments"][0]["sha256"] = file_sha256(path)
    live.manifest.path.write_text(json.dumps(doc))
    report = rebuild(live.data_dir, tmp_path / "rebuilt", SETTINGS)
    kinds = {d.kind for d in report.differences}
    assert {DifferenceKind.POSTINGS, DifferenceKind.BALANCE} <= kinds
    assert all(d.unit == "money_micros" for d in report.differences if d.unit)


def test_an_altered_audit_record_is_a_difference_and_verify_names_it(live, tmp_path):
    path = live.segments_root / AUDIT_NAME
    lines = path.read_bytes().splitlines(keepends=True)
    record = orjson.loads(lines[2])
    record["actor"] = "mallory"
    lines[2] = orjson.dumps(record) + b"\n"
    path.write_bytes(b"".join(lines))
    report = rebuild(live.data_dir, tmp_path / "rebuilt", SETTINGS)
    [difference] = report.differences
    assert (difference.kind, difference.subject) == (DifferenceKind.AUDIT, "audit record 3")
    assert "actor" in difference.note
    [problem] = verify_ledger(live.data_dir).problems
    assert "audit record 3 (position 3)" in problem and "altered" in problem


def test_a_truncated_audit_trail_passes_verify_but_not_rebuild(live, tmp_path):
    """Dropping the newest records leaves a valid chain, which `verify` cannot tell from a
    shorter trail; the archive replayed by `rebuild` still holds those actions."""
    path = live.segments_root / AUDIT_NAME
    lines = path.read_bytes().splitlines(keepends=True)
    assert len(lines) >= 3
    path.write_bytes(b"".join(lines[:-2]))
    assert verify_ledger(live.data_dir).problems == ()
    report = rebuild(live.data_dir, tmp_path / "rebuilt", SETTINGS)
    [difference] = report.differences
    assert (difference.kind, difference.subject) == (
        DifferenceKind.AUDIT,
        f"audit record {len(lines) - 1}",
    )
    assert (difference.live, difference.rebuilt) == (len(lines) - 2, len(lines))
    assert difference.note == "2 record(s) only in the rebuilt trail"


def test_a_missing_archive_range_is_a_difference(live, tmp_path):
    manifest = live.archive_manifest
    doc = json.loads(manifest.path.read_text())
    doc["segments"] = [s for s in doc["segments"] if s["incarnation"] != "cluster-b"]
    manifest.path.write_text(json.dumps(doc))
    report = rebuild(live.data_dir, tmp_path / "rebuilt", SETTINGS)
    gaps = [d for d in report.differences if d.kind is DifferenceKind.ARCHIVE]
    assert gaps and all("sealed but not archived" in d.note for d in gaps)
    assert any(d.kind is DifferenceKind.POSTINGS for d in report.differences)


def test_a_ledger_that_pruned_and_refused_rebuilds_identically(tmp_path, monkeypatch):
    """The prunes run between batches are archived with the next batch (the window), so the
    replay forgets the same ids and refuses the same events as too late to deduplicate."""
    with DuckDBStore(tmp_path / "live") as store:
        feed = Feed(store)
        feed.apply(feed.samples(usage(1)), feed.samples(usage(1, gpu="GPU-2"), partition=1))
        feed.apply(feed.samples(usage(100)))
        assert store.prune_seen_events(window_us=10 * INTERVAL_US) == 1
        store.prune_seen_events(window_us=20 * INTERVAL_US)  # composes to the smaller window
        # usage(1) was forgotten and usage(2) is new, both before GPU-1's cutoff: refused;
        # usage(100) is a duplicate; GPU-2 fell silent at 1, so its usage(2) is booked
        resent = feed.apply(
            feed.samples(usage(1), usage(2), usage(100)),
            feed.samples(usage(2, gpu="GPU-2"), partition=1),
        )
        assert (resent.commit.transactions, resent.commit.duplicates) == (1, 1)
        assert [d.reason.split(":")[0] for d in resent.dead_letters] == [
            "too late to deduplicate"
        ] * 2
        store.seal()
        data_dir = store.data_dir
        live_letters = store.dead_letters()
        live_balances = store.balance_rows()
    windows = [b.prune_window_us for b in archive_batches(data_dir)]
    assert windows == [None, None, 10 * INTERVAL_US]
    report = rebuild(data_dir, tmp_path / "rebuilt", SETTINGS)
    assert report.identical, report.differences
    with DuckDBStore(tmp_path / "rebuilt") as rebuilt:
        assert rebuilt.dead_letters() == live_letters
        assert rebuilt.balance_rows() == live_balances
    # a replay that did not prune would drop the resend as a duplicate and book usage(2)
    monkeypatch.setattr(DuckDBStore, "prune_seen_events", lambda _self, _window: 0)
    assert not rebuild(data_dir, tmp_path / "unpruned", SETTINGS).identical


def test_an_archive_from_before_dedupe_scopes_replays_its_cutoff(tmp_path):
    """Archives written before the per-scope prune carry `pruned_before_us` only (no
    `prune_window_us` column): the replay forgets everything before that cutoff."""
    with DuckDBStore(tmp_path / "live") as store:
        feed = Feed(store)
        feed.apply(feed.samples(usage(1)))
        feed.apply(feed.samples(usage(100)))
        assert store.prune_seen_before(T0_US + 50 * INTERVAL_US) == 1
        feed.apply(feed.samples(usage(1), usage(101)))
        store.seal()
        data_dir = store.data_dir
    for path in Manifest(data_dir / "archive").files():  # as an old writer wrote it
        con = duckdb.connect()
        con.execute(
            f"COPY (SELECT * EXCLUDE (prune_window_us) FROM read_parquet('{path}')) "
            f"TO '{path}.old' (FORMAT parquet)"
        )
        con.close()
        path.with_name(path.name + ".old").replace(path)
        doc = json.loads((data_dir / "archive" / "manifest.json").read_text())
        for seg in doc["segments"]:
            if (data_dir / "archive" / seg["path"]) == path:
                seg["sha256"] = file_sha256(path)
        (data_dir / "archive" / "manifest.json").write_text(json.dumps(doc))
    batches = list(archive_batches(data_dir))
    assert [(b.pruned_before_us, b.prune_window_us) for b in batches] == [
        (None, None),
        (None, None),
        (T0_US + 50 * INTERVAL_US, None),
    ]
    assert rebuild(data_dir, tmp_path / "rebuilt", SETTINGS).identical


def test_messages_from_the_topics_replace_the_archived_bytes():
    kept = ConsumedMessage("s", 0, 0, b"archived", b"k")
    changed = ConsumedMessage("s", 0, 1, b"archived", None)
    lost = ConsumedMessage("s", 0, 2, b"archived", None)
    batch = ArchivedBatch(1, "inc", None, (kept, changed, lost))
    fetched = {("inc", "s", 0, 0): (b"k", b"archived"), ("inc", "s", 0, 1): (None, b"other")}
    found: list = []
    (out,) = batches_from_messages([batch], fetched, found)
    assert [m.value for m in out.messages] == [b"archived", b"other", b"archived"]
    assert [(d.subject, d.note) for d in found] == [
        ("s[0]@1", "the broker's message differs from the archive's"),
        ("s[0]@2", "the broker no longer holds it (broker inc)"),
    ]


def test_coverage_is_compared_per_partition():
    from ledger.store.segments import SegmentInfo

    def seg(first, last, topic="s"):
        return SegmentInfo(f"{topic}{first}", "i", topic, 0, first, last, 1, "", None, None)

    gaps = archive_coverage(
        [seg(0, 4), seg(5, 9), seg(0, 3, "t")], [seg(0, 2), seg(6, 12), seg(0, 3, "u")]
    )
    assert [(g.topic, g.first, g.last, g.archived) for g in gaps] == [
        ("s", 3, 5, False),
        ("s", 10, 12, True),
        ("t", 0, 3, False),
        ("u", 0, 3, True),
    ]


# ---------------------------------------------------------------------------- the command


@pytest.fixture
def config_path(tmp_path, live):
    return write_config(
        tmp_path / "tally.yaml", a_config_dict(ledger={"data_dir": str(live.data_dir)})
    )


def test_the_rebuild_command_exits_0_when_identical(config_path, tmp_path):
    into = tmp_path / "kept"
    result = CliRunner().invoke(
        cli,
        ["ledger", "rebuild", "--config", str(config_path), "--into", str(into), "--keep"],
    )
    assert result.exit_code == 0, result.output
    assert "identical to the live one" in result.output
    assert (into / "hot.duckdb").exists() and verify_ledger(into).ok
    result = CliRunner().invoke(
        cli, ["ledger", "rebuild", "--config", str(config_path), "-o", "json"]
    )
    assert result.exit_code == 0, result.output
    doc = orjson.loads(result.output)
    assert doc["identical"] and doc["differences"] == [] and doc["rebuilt"] is None


def test_the_rebuild_command_exits_1_with_a_table_of_differences(config_path, live, tmp_path):
    doc = json.loads(live.archive_manifest.path.read_text())
    doc["segments"] = doc["segments"][1:]
    live.archive_manifest.path.write_text(json.dumps(doc))
    into = tmp_path / "discarded"
    result = CliRunner().invoke(
        cli, ["ledger", "rebuild", "--config", str(config_path), "--into", str(into)]
    )
    assert result.exit_code == 1, result.output
    assert "KIND" in result.output and "archive" in result.output
    assert "difference(s) found" in result.output
    assert not into.exists()  # not kept
    as_json = CliRunner().invoke(
        cli, ["ledger", "rebuild", "--config", str(config_path), "-o", "json"]
    )
    assert as_json.exit_code == 1
    assert orjson.loads(as_json.output)["differences"][0]["kind"] == "archive"


def test_the_rebuild_command_uses_the_configured_prices(live, tmp_path):
    other = a_config_dict(
        ledger={"data_dir": str(live.data_dir)},
        prices=[{"model": "NVIDIA H100 80GB HBM3", "per_gpu_hour": "9.99"}],
    )
    path = write_config(tmp_path / "other.yaml", other)
    result = CliRunner().invoke(cli, ["ledger", "rebuild", "--config", str(path), "-o", "csv"])
    assert result.exit_code == 1
    assert result.output.startswith("kind,subject,unit,period,live,rebuilt,note")
    assert "money_micros" in result.output


def test_replay_settings_follow_the_config():
    assert (
        ReplaySettings(
            CONFIG.price_book(),
            CONFIG.organisation.cost_centre_of(),
            CONFIG.idle.policy(),
            InputTopics(CONFIG.topics.admin, CONFIG.topics.jobs),
        )
        == SETTINGS
    )
