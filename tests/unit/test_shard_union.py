"""Several shards of one published ledger (`shards/<name>/` of one object store), read as one:
each shard is a whole ledger published by the ordinary `Publisher` over a `PrefixedStore`, and
`pull` brings their union into the read cache that reports, verify and rebuild read
(`ledger.store.union`). The shards are built once per module with the existing builders, on
distinct samples partitions: `global` (admin, jobs and partitions 0-1; November closed),
`samples-2` (closes November too) and `samples-3` (does not)."""

from __future__ import annotations

import shutil
from collections import Counter
from collections.abc import Sequence
from decimal import Decimal
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from ledger.admin import PeriodClosed
from ledger.errors import SegmentError
from ledger.store.head import WriterFenced
from ledger.store.hot import DuckDBStore
from ledger.store.objects import LocalObjectStore, ObjectInfo, ObjectStore, PrefixedStore
from ledger.store.published import PublishedStore
from ledger.store.rebuild import archive_batch_count
from ledger.store.replica import Publisher, pull
from ledger.store.segments import Manifest
from ledger.store.side_files import RefusedGroup, load_closed_periods
from ledger.store.union_rules import (
    closed_in_union,
    common_zone,
    shard_of_head_key,
    summed_refused,
)
from ledger.store.verify import verify_ledger
from tally.cli import cli
from tests.builders import a_config_dict
from tests.conftest import write_config
from tests.unit.test_ledger_on_s3 import RacingStore, totals
from tests.unit.test_rebuild import META, Feed, build_live, usage
from tests.unit.test_store import ingest, message

SHARDS = ("global", "samples-2", "samples-3")


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("shards")
    with DuckDBStore(base / "global") as store:
        build_live(store)  # partitions 0 and 1, admin and jobs; closes November
    with DuckDBStore(base / "samples-2") as store:
        feed = Feed(store)
        on_2 = {"gpu": "GPU-7", "team": "language", "job": "job-7"}
        feed.apply(feed.samples(usage(1, **on_2), usage(2, **on_2), partition=2))
        store.seal()
        feed.apply(feed.admin(PeriodClosed("2026-11", *META)))  # as every shard applies it
        feed.apply(feed.samples(usage(3, **on_2), partition=2))
        store.seal()
    with DuckDBStore(base / "samples-3") as store:
        ingest(store, message(0, 1, 2, partition=3, gpu="GPU-8"), message(1, 4, partition=3))
        store.seal()
    return {name: base / name for name in SHARDS}


def publish(store: ObjectStore, shards: dict[str, Path], *names: str) -> None:
    for name in names:
        Publisher(shards[name], PrefixedStore(store, f"shards/{name}")).push()


_TOTALS: dict[Path, tuple[int, dict[str, int]]] = {}


def own_totals(shard: Path) -> tuple[int, dict[str, int]]:
    """A shard's totals read from its writer's directory (once: the shards do not change)."""
    if shard not in _TOTALS:
        _TOTALS[shard] = totals(shard)
    return _TOTALS[shard]


def summed(*parts: tuple[int, dict[str, int]]) -> tuple[int, dict[str, int]]:
    units: Counter[str] = Counter()
    for _, by_unit in parts:
        units.update(by_unit)
    return sum(n for n, _ in parts), dict(units)


def cost_by_team(runner: CliRunner, *args: str) -> Counter[str]:
    result = runner.invoke(cli, ["report", "cost", "--by", "team", "-o", "json", *args])
    assert result.exit_code == 0, result.output
    return Counter({row["team"]: Decimal(row["cost"]) for row in orjson.loads(result.output)})


def test_a_shard_is_published_as_a_whole_ledger_is(tmp_path, shards):
    whole, sharded = LocalObjectStore(tmp_path / "whole"), LocalObjectStore(tmp_path / "sharded")
    Publisher(shards["samples-2"], whole).push()
    Publisher(shards["samples-2"], PrefixedStore(sharded, "shards/samples-2")).push()
    objects = {o.key: whole.get(o.key) for o in whole.list() if o.key != "head.json"}
    assert {f"shards/samples-2/{key}": data for key, data in objects.items()} == {
        o.key: sharded.get(o.key) for o in sharded.list() if not o.key.endswith("head.json")
    }
    assert [o.key for o in sharded.list() if o.key.endswith("head.json")] == [
        "shards/samples-2/head.json"
    ]


def test_readers_see_the_union_of_the_shards(tmp_path, shards):
    store = LocalObjectStore(tmp_path / "store")
    config = write_config(
        tmp_path / "tally.yaml",
        a_config_dict(
            ledger={"data_dir": str(tmp_path / "reader"), "segments_url": store.describe()}
        ),
    )
    runner = CliRunner()
    publish(store, shards, "global", "samples-2")  # both closed November
    verified = runner.invoke(cli, ["ledger", "verify", "-c", str(config), "-o", "json"])
    assert verified.exit_code == 0, verified.output
    report = orjson.loads(verified.output)
    assert report["ok"] is True
    assert sorted(report["shards"]) == ["global", "samples-2"]
    assert report["segments"] == sum(s["segments"] for s in report["shards"].values())
    assert report["closed_periods"] == 1  # its record holds the union's postings: verified
    cache = tmp_path / "reader" / "replica"
    (record,) = load_closed_periods(cache / "segments")
    own = [load_closed_periods(shards[n] / "segments")[0] for n in ("global", "samples-2")]
    assert record.period == "2026-11"
    assert record.rows == sum(r.rows for r in own) > own[0].rows
    assert record.event_id == own[0].event_id  # the close, as the global shard recorded it

    publish(store, shards, "samples-3")  # a shard that has not closed November
    expected: Counter[str] = Counter()
    for name in SHARDS:
        expected.update(cost_by_team(runner, "--data-dir", str(shards[name])))
    assert cost_by_team(runner, "-c", str(config)) == expected
    assert totals(cache) == summed(*(own_totals(shards[name]) for name in SHARDS))
    assert load_closed_periods(cache / "segments") == []  # open in the union now
    assert [c.period for c in load_closed_periods(cache / "shards/global/segments")] == ["2026-11"]
    # the union is linked to the shards' files, not a copy of them
    union = Manifest(cache / "segments").load()
    assert {seg.path.split("/")[1] for seg in union} == set(SHARDS)
    assert (cache / "segments" / union[0].path).stat().st_nlink == 2
    # the admin log and the audit trail are the global shard's
    for name in ("admin-log.json", "audit.jsonl"):
        assert (cache / "segments" / name).read_bytes() == (
            shards["global"] / "segments" / name
        ).read_bytes()


def test_readers_see_a_shard_on_s3(tmp_path, shards, s3_store):
    publish(s3_store, shards, "samples-3")
    cache = pull(s3_store, tmp_path / "cache")
    assert (cache / "union.json").is_file()
    assert totals(cache) == own_totals(shards["samples-3"])


def test_verify_names_the_shard_of_a_damaged_object(tmp_path, shards):
    store = LocalObjectStore(tmp_path / "store")
    publish(store, shards, "samples-2", "samples-3")
    cache = pull(store, tmp_path / "cache")
    damaged = Manifest(cache / "shards" / "samples-2" / "segments").load()[0].path
    target = cache / "shards" / "samples-2" / "segments" / damaged
    target.write_bytes(target.read_bytes()[:-20])  # cut short in place: the union's link too
    # a union record of a period not every shard closed (samples-3 did not) is a problem
    (cache / "segments" / "closed").mkdir(exist_ok=True)
    (cache / "segments" / "closed" / "2026-11.json").write_bytes(
        (shards["samples-2"] / "segments" / "closed" / "2026-11.json").read_bytes()
    )
    report = verify_ledger(cache)
    assert not report.ok
    assert report.problems[0].startswith("the union shows closed 2026-11, but the periods every")
    shard_problems = [p for p in report.problems if p.startswith("shard samples-2: ")]
    assert shard_problems and damaged in shard_problems[0]
    assert not any(p.startswith("shard samples-3") for p in report.problems)
    assert dict(report.shards)["samples-2"].ok is False
    assert dict(report.shards)["samples-3"].ok is True
    # in the store, the damaged object is named with its shard's prefix
    stored = next(
        o.key for o in store.list("shards/samples-3/segments/") if o.key.endswith(".parquet")
    )
    store.put(stored, b"PAR1 not what was sealed")
    with pytest.raises(SegmentError, match=r"shards/samples-3/segments/.*checksum does not"):
        pull(store, tmp_path / "other")


class Recording:
    """The real store, recording every call made to it as (operation, key or prefix)."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.calls: list[tuple[str, str]] = []

    def _called(self, operation: str, key: str) -> None:
        self.calls.append((operation, key))

    def keys(self, *operations: str) -> list[str]:
        return [key for operation, key in self.calls if operation in operations]

    def get(self, key: str) -> bytes:
        self._called("get", key)
        return self.inner.get(key)

    def put(self, key: str, data: bytes) -> None:
        self._called("put", key)
        self.inner.put(key, data)

    def delete(self, key: str) -> None:
        self._called("delete", key)
        self.inner.delete(key)

    def get_tagged(self, key: str) -> tuple[bytes, str]:
        self._called("get_tagged", key)
        return self.inner.get_tagged(key)

    def put_if(self, key: str, data: bytes, tag: str | None) -> str:
        self._called("put_if", key)
        return self.inner.put_if(key, data, tag)

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        self._called("list", prefix)
        return self.inner.list(prefix)

    def folders(self, folder: str = "") -> Sequence[str]:
        self._called("folders", folder)
        return self.inner.folders(folder)

    def describe(self) -> str:
        return self.inner.describe()


def test_a_pull_lists_the_shards_folders_and_fetches_only_what_their_heads_name(tmp_path, shards):
    inner = LocalObjectStore(tmp_path / "store")
    publish(inner, shards, "samples-3")
    inner.put("shards/not-yet/segments/x.parquet", b"a shard's first object, before its head")
    store = Recording(inner)
    cache = pull(store, tmp_path / "cache")
    assert totals(cache) == own_totals(shards["samples-3"])
    assert store.keys("list", "folders") == ["shards"]  # one listing: the folders, no objects
    assert store.keys("get_tagged") == [
        "shards/not-yet/head.json",
        "shards/samples-3/head.json",
        "head.json",
    ]
    fetched = store.keys("get")
    assert len(fetched) == len(set(fetched))  # each object once
    named = {o.key for o in inner.list("shards/samples-3/") if not o.key.endswith("head.json")}
    root = {"segments/manifest.json", "archive/manifest.json"}  # no root ledger: read, absent
    assert set(fetched) == named | root  # one publish: the head names every object it stored
    store.calls.clear()
    pull(store, cache)  # nothing changed: no segment fetched again
    assert [k for k in store.keys("get") if k.endswith(".parquet")] == []


def test_a_root_ledger_beside_shards_is_one_more_and_the_cache_follows_the_store(tmp_path, shards):
    store = LocalObjectStore(tmp_path / "store")
    Publisher(shards["samples-3"], store).push()  # the store's one ledger, before shards
    cache = pull(store, tmp_path / "cache")
    assert totals(cache) == own_totals(shards["samples-3"])
    files = [p for p in cache.rglob("*.parquet")]
    cached = {p.relative_to(cache): p.stat().st_ino for p in files}
    publish(store, shards, "samples-2")
    recording = Recording(store)
    pull(recording, cache)
    assert totals(cache) == summed(own_totals(shards["samples-2"]), own_totals(shards["samples-3"]))
    assert sorted(p.name for p in (cache / "shards").iterdir()) == ["_root", "samples-2"]
    # the root ledger's files were cached: linked as the root shard's, not downloaded again
    fetched = [k for k in recording.keys("get") if k.endswith(".parquet")]
    assert fetched and all(k.startswith("shards/samples-2/") for k in fetched)
    root = cache / "shards" / "_root"
    assert {rel: (root / rel).stat().st_ino for rel in cached} == cached
    assert verify_ledger(cache).ok
    # the union's archive is no one ledger's to replay (each shard numbers its batches)
    with pytest.raises(SegmentError, match="is the union of the shards _root, samples-2"):
        archive_batch_count(cache)
    assert archive_batch_count(cache / "shards" / "_root")[0] > 0  # a shard is one ledger
    for o in store.list("shards/"):  # the shards are gone: one ledger again
        store.delete(o.key)
    pull(store, cache)
    assert totals(cache) == own_totals(shards["samples-3"])
    assert not (cache / "shards").exists() and not (cache / "union.json").exists()


def test_a_transaction_in_two_shards_is_a_problem(tmp_path, shards):
    store = LocalObjectStore(tmp_path / "store")
    publish(store, shards, "samples-3")
    Publisher(shards["samples-3"], PrefixedStore(store, "shards/copy")).push()  # the same rows
    report = verify_ledger(pull(store, tmp_path / "cache"))
    assert all(r.ok for _, r in report.shards)  # each shard alone is sound
    doubled = [p for p in report.problems if "appears in shards" in p]
    assert len(doubled) == own_totals(shards["samples-3"])[0]
    assert doubled[0].endswith("appears in shards copy, samples-3")


class CountingHeads(RacingStore):
    """A racing store (`RacingStore`) that records every head it is asked for."""

    def __init__(self, inner, race) -> None:
        super().__init__(inner, race)
        self.heads: list[str] = []

    def get_tagged(self, key: str) -> tuple[bytes, str]:
        self.heads.append(key)
        return super().get_tagged(key)


def test_each_head_is_read_once_per_pull_and_again_when_it_changed_mid_pull(tmp_path, shards):
    store = LocalObjectStore(tmp_path / "store")
    publish(store, shards, "samples-2")
    shard = PrefixedStore(store, "shards/samples-2")
    # another writer takes the shard (with other rows) between its head and its first segment
    # being read, and the objects it no longer names go at once (no grace)
    racing = CountingHeads(store, lambda: Publisher(shards["samples-3"], shard, grace_s=0).push())
    cache = pull(racing, tmp_path / "cache")
    assert racing.race is None
    assert totals(cache) == own_totals(shards["samples-3"])
    heads = ["head.json", "shards/samples-2/head.json"]  # the root's, the shard's
    assert sorted(racing.heads) == sorted([*heads, "shards/samples-2/head.json"])
    racing.heads.clear()
    pull(racing, cache)
    assert sorted(racing.heads) == heads


def test_shards_keeping_their_books_in_other_time_zones_are_refused(tmp_path, shards):
    shanghai = tmp_path / "samples-3"  # a shard whose writer keeps its books in Shanghai
    shutil.copytree(shards["samples-3"], shanghai, ignore=shutil.ignore_patterns("hot.duckdb*"))
    (shanghai / "ledger.json").write_bytes(b'{"version": 1, "timezone": "Asia/Shanghai"}')
    store = LocalObjectStore(tmp_path / "store")
    publish(store, dict(shards, **{"samples-3": shanghai}), "samples-2", "samples-3")
    with pytest.raises(SegmentError, match="shard samples-2 in UTC, shard samples-3 in Asia/Sha"):
        pull(store, tmp_path / "cache")


def test_a_fenced_shard_writer_changes_nothing_readers_see(tmp_path, shards):
    store = LocalObjectStore(tmp_path / "store")
    publish(store, shards, "samples-2")
    shard = PrefixedStore(store, "shards/samples-3")
    live = tmp_path / "samples-3"
    shutil.copytree(shards["samples-3"], live)
    with PublishedStore(live, Publisher(live, shard)) as old:
        old.publisher.push()  # the shard's writer claims it
        before = summed(own_totals(shards["samples-2"]), own_totals(shards["samples-3"]))
        assert totals(pull(store, tmp_path / "cache")) == before
        Publisher(live, shard).claim()  # a new owner of the partition fences it
        ingest(old, message(2, 6, 7, partition=3, gpu="GPU-8"))
        with pytest.raises(WriterFenced):
            old.seal()
    assert totals(pull(store, tmp_path / "cache")) == before
    assert verify_ledger(tmp_path / "cache").ok


@pytest.mark.parametrize(
    ("closed", "union"),
    [
        pytest.param({"a": ["2026-10", "2026-11"], "b": ["2026-11"]}, ["2026-11"], id="both"),
        pytest.param({"a": ["2026-11"], "b": []}, [], id="one-shard-open"),
        pytest.param({"a": ["2026-11"]}, ["2026-11"], id="one-shard"),
        pytest.param({}, [], id="no-shards"),
    ],
)
def test_the_union_shows_closed_what_every_shard_closed(closed, union):
    assert closed_in_union(closed) == union


def test_the_dead_letters_of_shards_are_summed_per_reason_and_topic():
    def group(letters, first, last, topic="samples"):
        return RefusedGroup("undecodable", topic, letters, first, last, f"undecodable at {last}")

    summed_groups = summed_refused([[group(2, 10, 20)], [group(3, 5, 15), group(1, 7, 7, "admin")]])
    assert summed_groups == [
        RefusedGroup("undecodable", "samples", 5, 5, 20, "undecodable at 20"),
        RefusedGroup("undecodable", "admin", 1, 7, 7, "undecodable at 7"),
    ]


@pytest.mark.parametrize(
    ("key", "shard"),
    [
        pytest.param("shards/samples-3/head.json", "samples-3", id="a-head"),
        pytest.param("shards/global/segments/head.json", None, id="nested"),
        pytest.param("shards/_root/head.json", None, id="not-a-shard-name"),
        pytest.param("head.json", None, id="the-root"),
    ],
)
def test_a_shard_is_found_by_its_head(key, shard):
    assert shard_of_head_key(key) == shard


def test_one_zone_for_all_shards():
    assert common_zone({"a": "UTC", "global": "UTC"}) == "UTC"
    with pytest.raises(SegmentError, match="shard global in UTC, shard a in Europe/Paris"):
        common_zone({"a": "Europe/Paris", "global": "UTC"})


def test_rebuild_over_a_union_replays_each_shard_and_names_it_in_a_difference(tmp_path, shards):
    """`tally ledger rebuild` over a union replays each shard's own archive with its directory's
    role (that every role replays identical: `test_shard_roles_sum`). These shards' writers
    folded as whole ledgers, so each replay differs somewhere, and each difference names its
    shard; the JSON gives each shard's own figures."""
    store = LocalObjectStore(tmp_path / "store")
    publish(store, shards, *SHARDS)
    cache = pull(store, tmp_path / "cache")
    config = write_config(tmp_path / "tally.yaml", a_config_dict())
    args = ["ledger", "rebuild", "-c", str(config), "--data-dir", str(cache), "-o", "json"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1, (result.output, result.exception)
    assert result.stdout, (result.stderr, result.exception)
    report = orjson.loads(result.output)
    assert sorted(report["shards"]) == sorted(SHARDS)
    # the global shard's archive holds samples, which a global shard never folds: refused
    refused = [d for d in report["differences"] if d["subject"].startswith("global: ")]
    assert [d["kind"] for d in refused] == ["replay"] and "takes no samples" in refused[0]["note"]
    for name in ("samples-2", "samples-3"):
        assert report["shards"][name]["batches"] == archive_batch_count(shards[name])[0]
    assert report["batches"] == sum(f["batches"] for f in report["shards"].values())
    named = {d["subject"].split(": ", 1)[0] for d in report["differences"]}
    assert named == {n for n, f in report["shards"].items() if not f["identical"]} != set()
