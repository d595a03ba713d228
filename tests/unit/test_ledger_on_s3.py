"""The sealed ledger on object storage (`ledger.segments_url`), against a real S3 API server
on loopback (`tests.s3_server`): a writer seals and publishes, and readers on another
directory — reports, verify, rebuild — read it back from the store exactly; a store failing
mid-seal is retried, shows no partial manifest and loses nothing; a reader racing a
compaction sees the old manifest or the new one, with every object it names."""

from __future__ import annotations

import errno
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from click.testing import CliRunner

from ledger.errors import SealError
from ledger.read.queries import LedgerQueries
from ledger.read.reports import ReportQueries
from ledger.store.objects import ObjectInfo, ObjectStore
from ledger.store.published import PublishedStore
from ledger.store.replica import REPLICA_DIR, Publisher, pull, read_published
from ledger.store.rollup_files import LEVELS
from ledger.store.verify import verify_ledger
from tally.cli import cli
from tests.builders import a_config_dict
from tests.conftest import write_config
from tests.s3_server import ACCESS_KEY, SECRET_KEY
from tests.unit.test_rebuild import build_live
from tests.unit.test_store import ingest, message


def totals(data_dir: Path) -> tuple[int, dict[str, int]]:
    """Transactions and positive amounts per unit; each rollup level must hold every account's
    (the metered one: every team's) sum and postings count exactly, so a rollup missing or stale
    cannot pass."""
    q = ReportQueries(data_dir)
    try:
        by_account = "SELECT account, unit, sum(amount), {count} FROM {source} GROUP BY ALL"
        direct = q.rows(by_account.format(count="count(*)", source="{postings}"))
        for source in ("{rollups}", "{coarse}", "{daily}"):
            rolled = q.rows(by_account.format(count="sum(postings)", source=source))
            assert sorted(rolled) == sorted(direct), source
        metered = "SELECT team, sum(amount), {count} FROM {source} WHERE {where} GROUP BY ALL"
        consumer = "account LIKE 'consumer:%' AND unit = 'gpu_ms' AND team IS NOT NULL"
        assert sorted(
            q.rows(metered.format(count="sum(postings)", source="{metered}", where="TRUE"))
        ) == sorted(q.rows(metered.format(count="count(*)", source="{postings}", where=consumer)))
        return q.transaction_count(), q.totals_by_unit()
    finally:
        q.close()


def segment_count(data_dir: Path) -> int:
    q = LedgerQueries(data_dir)
    try:
        return len(q.segments())
    finally:
        q.close()


class FaultyStore:
    """An object store whose `put` of the keys `hit` picks fails `times` times (an I/O error
    from the store), then works again."""

    def __init__(self, inner: ObjectStore, hit: Callable[[str], bool], times: int) -> None:
        self.inner, self.hit, self.times = inner, hit, times
        self.failed: list[str] = []

    def get(self, key: str) -> bytes:
        return self.inner.get(key)

    def put(self, key: str, data: bytes) -> None:
        self._fault(key)
        self.inner.put(key, data)

    def get_tagged(self, key: str) -> tuple[bytes, str]:
        return self.inner.get_tagged(key)

    def put_if(self, key: str, data: bytes, tag: str | None) -> str:
        self._fault(key)
        return self.inner.put_if(key, data, tag)

    def _fault(self, key: str) -> None:
        if self.times > 0 and self.hit(key):
            self.times -= 1
            self.failed.append(key)
            raise OSError(errno.EIO, "injected store failure", key)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        return self.inner.list(prefix)

    def folders(self, folder: str = "") -> Sequence[str]:
        return self.inner.folders(folder)

    def describe(self) -> str:
        return self.inner.describe()


class RacingStore(FaultyStore):
    """A reader's view of the store that runs `race` (a compaction) just before it fetches its
    first segment: between reading the manifest and reading the objects it names."""

    def __init__(self, inner: ObjectStore, race: Callable[[], object]) -> None:
        super().__init__(inner, lambda key: False, 0)
        self.race: Callable[[], object] | None = race

    def get(self, key: str) -> bytes:
        if key.endswith(".parquet") and self.race is not None:
            race, self.race = self.race, None
            race()
        return self.inner.get(key)


def test_readers_on_another_directory_read_the_ledger_from_s3_exactly(
    tmp_path, s3_server, s3_bucket, monkeypatch
):
    store_url = f"s3://{s3_bucket}/ledger/prod"
    from ledger.store.objects import S3ObjectStore

    remote = S3ObjectStore(s3_bucket, "ledger/prod", s3_server.settings())
    live = tmp_path / "writer"
    with PublishedStore(live, Publisher(live, remote)) as writer:
        build_live(writer)  # seals twice, compacts, closes November
    expected = totals(live)
    assert expected[1]["gpu_ms"] > 0
    monkeypatch.setenv("TEST_S3_KEY", ACCESS_KEY)
    monkeypatch.setenv("TEST_S3_SECRET", SECRET_KEY)
    reader = tmp_path / "reader"  # another host: nothing of the writer's directory
    config = write_config(
        tmp_path / "tally.yaml",
        a_config_dict(
            ledger={
                "data_dir": str(reader),
                "segments_url": store_url,
                "object_store": {
                    "endpoint_url": s3_server.endpoint_url,
                    "access_key_id_env": "TEST_S3_KEY",
                    "secret_access_key_env": "TEST_S3_SECRET",
                },
            }
        ),
    )
    runner = CliRunner()
    from_s3 = runner.invoke(cli, ["report", "cost", "-c", str(config), "--by", "team", "-o", "csv"])
    local = runner.invoke(
        cli,
        ["report", "cost", "-c", str(config), "--data-dir", str(live), "--by", "team", "-o", "csv"],
    )
    assert from_s3.exit_code == 0, from_s3.output
    assert from_s3.output == local.output
    assert totals(reader / REPLICA_DIR) == expected
    verified = runner.invoke(cli, ["ledger", "verify", "-c", str(config), "-o", "json"])
    assert verified.exit_code == 0, verified.output
    assert '"ok": true' in verified.output
    rebuilt = runner.invoke(cli, ["ledger", "rebuild", "-c", str(config), "-o", "csv"])
    assert rebuilt.exit_code == 0, rebuilt.output
    # the readers read what the store holds: the manifests are the writer's, byte for byte
    for name in ("segments/manifest.json", "archive/manifest.json", "segments/audit.jsonl"):
        assert (reader / REPLICA_DIR / name).read_bytes() == (live / name).read_bytes()


def test_without_the_credential_variable_a_reader_is_told_which(tmp_path, s3_bucket):
    config = write_config(
        tmp_path / "tally.yaml",
        a_config_dict(
            ledger={
                "data_dir": str(tmp_path / "reader"),
                "segments_url": f"s3://{s3_bucket}",
                "object_store": {"access_key_id_env": "TALLY_TEST_UNSET_KEY"},
            }
        ),
    )
    result = CliRunner().invoke(cli, ["report", "cost", "-c", str(config)])
    assert result.exit_code == 2
    assert "TALLY_TEST_UNSET_KEY is not set" in result.output


def _segment(key: str) -> bool:
    return key.startswith("segments/") and key.endswith(".parquet")


def _version_of(path: str) -> Callable[[str], bool]:
    return lambda key: key.startswith(f"versions/{path}/")


FAILURES = [
    pytest.param(_segment, False, id="a-segment"),
    pytest.param(_version_of("segments/manifest.json"), False, id="the-postings-manifest"),
    pytest.param(lambda key: key == "head.json", False, id="the-head"),
    # side files are written after the rows are published: those are sealed, the file waits
    pytest.param(_version_of("segments/refused.json"), True, id="a-side-file"),
]


@pytest.mark.parametrize(("hit", "rows_published"), FAILURES)
def test_a_store_failing_mid_seal_shows_no_partial_manifest_and_loses_nothing(
    tmp_path, s3_store, hit, rows_published
):
    faulty = FaultyStore(s3_store, hit, times=0)
    live = tmp_path / "writer"
    publisher = Publisher(live, faulty, attempts=2, sleep=lambda s: None)
    with PublishedStore(live, publisher) as writer:
        ingest(writer, message(0, 1, 2), message(1, 3))
        writer.seal()
        before = totals(pull(s3_store, tmp_path / "r1"))
        remote_manifest = read_published(s3_store, "segments/manifest.json")
        local_manifest = writer.manifest.path.read_bytes()
        ingest(writer, message(2, 4, 5), message(3, 6), message(4, value=b"{not json"))
        waiting = writer.hot_rows()
        after = (before[0] + 3, {unit: 2 * total for unit, total in before[1].items()})

        faulty.times = 10  # more than the publisher's attempts: the seal fails
        with pytest.raises(SealError) as failed:
            writer.seal()
        assert failed.value.path == f"{s3_store.describe()}/{faulty.failed[0]}"
        assert failed.value.reason == "Input/output error"
        assert len(faulty.failed) == 2  # tried again before giving up
        if rows_published:  # the manifest naming them was stored before they left
            assert writer.hot_rows() == 0
            assert totals(pull(s3_store, tmp_path / "r2")) == after
        else:  # nothing lost: the rows wait in the hot tables; nothing partial visible
            assert writer.hot_rows() == waiting
            assert read_published(s3_store, "segments/manifest.json") == remote_manifest
            assert totals(pull(s3_store, tmp_path / "r2")) == before
            assert writer.manifest.path.read_bytes() == local_manifest
            assert totals(live) == before

        faulty.times = 1  # one more failure: retried within the seal, which succeeds
        writer.seal()
        assert writer.hot_rows() == 0
        assert faulty.times == 0
    assert totals(live) == after
    reader = pull(s3_store, tmp_path / "r3")
    assert totals(reader) == after
    assert verify_ledger(reader).ok
    for name in ("segments/manifest.json", "archive/manifest.json", "segments/refused.json"):
        assert (reader / name).read_bytes() == (live / name).read_bytes()


@pytest.mark.parametrize(
    ("grace_s", "segments_seen"),
    [
        pytest.param(3600.0, 4, id="within-grace-the-old-manifest-whole"),
        pytest.param(0.0, 1, id="after-grace-retried-with-the-new-manifest"),
    ],
)
def test_a_reader_racing_a_compaction_sees_a_whole_manifest(
    tmp_path, s3_store, grace_s, segments_seen
):
    live = tmp_path / "writer"
    publisher = Publisher(live, s3_store, grace_s=grace_s)
    with PublishedStore(live, publisher) as writer:
        for offset in range(4):  # four small segments, left uncompacted
            ingest(writer, message(offset, offset + 1))
            writer.seal(compact_min_segments=100)
        expected = totals(live)
        old = {o.key for o in s3_store.list("segments/") if o.key.endswith(".parquet")}
        assert len(old) == 4 * (1 + len(LEVELS))  # four segments, each with its rollups

        racing = RacingStore(s3_store, lambda: writer.seal(compact_min_segments=2))
        reader = pull(racing, tmp_path / "reader")
        assert racing.race is None  # the compaction ran mid-pull
        assert segment_count(live) == 1
        assert segment_count(reader) == segments_seen
        assert totals(reader) == expected
        assert verify_ledger(reader).ok

        kept = {o.key for o in s3_store.list("segments/") if o.key.endswith(".parquet")}
        assert (old <= kept) is (grace_s > 0)  # superseded objects stay for the grace period
        assert totals(pull(s3_store, tmp_path / "reader")) == expected
        assert segment_count(tmp_path / "reader") == 1


def test_a_writer_without_a_sealed_ledger_never_publishes_over_one(tmp_path, s3_store):
    with PublishedStore(tmp_path / "first", Publisher(tmp_path / "first", s3_store)) as first:
        ingest(first, message(0, 1, 2))
        first.seal()
    published = read_published(s3_store, "segments/manifest.json")
    lost = tmp_path / "new-disk"  # the writer's disk was replaced: the store has the ledger
    with PublishedStore(lost, Publisher(lost, s3_store, attempts=1)) as second:
        ingest(second, message(0, 5))
        waiting = second.hot_rows()
        with pytest.raises(SealError, match=r"the store holds a sealed ledger and .* has none"):
            second.seal()
        assert second.hot_rows() == waiting
    assert read_published(s3_store, "segments/manifest.json") == published


def test_a_reader_elsewhere_keeps_the_books_in_the_writers_time_zone(tmp_path, s3_store):
    from zoneinfo import ZoneInfo

    from ledger.periods import zone_name
    from ledger.store.identity import claim_zone, recorded_zone

    live = tmp_path / "writer"
    claim_zone(live, ZoneInfo("Asia/Shanghai"))  # as the worker does before its first batch
    with PublishedStore(live, Publisher(live, s3_store)) as writer:
        ingest(writer, message(0, 1, 2))
        writer.seal()
    reader = pull(s3_store, tmp_path / "reader" / REPLICA_DIR)
    assert zone_name(recorded_zone(reader)) == "Asia/Shanghai"  # not the UTC of no record
    assert (reader / "ledger.json").read_bytes() == (live / "ledger.json").read_bytes()
