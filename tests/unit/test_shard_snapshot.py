"""A moved shard taken up from the snapshot its head names (`ledger.store.snapshot`,
`streams.shards.restore`), in process on a local directory store.

A writer folds a stream into a samples shard and the global shard — holds placed, released and
settled by the shards' watermark (moving a job's hold baseline; the job retried later), a price
set and changed, a late owner, a reversal, a period close, a GPU idle for over half an
hour and busy again, garbage — sealing three times (the last at the hand-over), pruning its
dedupe window after each seal, as the worker does, and hands the shard over. The shard is then
taken up three ways: from its snapshot; by replaying its whole archive; and from the snapshot of
an earlier seal with the archived batches after it folded on top. All three hold the same state,
table by table and row by row (what a wall clock stamps apart), and fold the next batches —
samples resent from before the move (some already forgotten by the window), a price change, more
holds — into the same postings, row by row.

Then: a fenced writer's snapshot (its head refused) is never loaded; a head that names no
snapshot (a ledger sealed before snapshots) is replayed, and a snapshot that does not fit the
sealed ledger is refused with the reason."""

from __future__ import annotations

import io
import logging
import shutil
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import duckdb
import orjson
import pytest

from ledger.admin import BudgetGranted, JobUsage, PriceSet, ShardsSealedThrough
from ledger.events import encode_batch
from ledger.ingest import ConsumedMessage, Ingestor, InputTopics, OutputTopics, ShardRole
from ledger.store.head import WriterFenced, version_key
from ledger.store.hot import DuckDBStore
from ledger.store.layout import HOT_DB_NAME, SNAPSHOT_NAME
from ledger.store.objects import LocalObjectStore
from ledger.store.published import PublishedStore
from ledger.store.rebuild import ReplaySettings, archive_batch_count
from ledger.store.replica import Publisher, published_head, pull_ledger_with, read_published
from ledger.store.snapshot import SnapshotMismatch, take_up
from ledger.units import Unit
from streams.shards import (
    GLOBAL,
    Restored,
    ShardSettings,
    ShardSpec,
    close_shard,
    local_manifests,
    open_shard,
    remote_of,
    restore,
    samples_shard,
)
from tests.builders import a_process, an_envelope
from tests.ledger_harness import CENTRES, PRICES
from tests.unit.test_shard_roles_sum import (
    ADMIN,
    JOB_1,
    JOBS,
    META,
    MODEL,
    SAMPLES,
    SCRATCH,
    STREAM,
    Item,
    admin,
    at,
    hold,
    jobs,
    located,
    samples,
)

INC = "c"
WINDOW_US = 20 * 60 * 1_000_000  # the dedupe window the writer prunes to after each seal
REPLAY = ReplaySettings(PRICES, CENTRES, inputs=InputTopics(ADMIN, JOBS))
OUTPUTS = OutputTopics("alerts", "dl", "balances")


MINUTE_US = 60_000_000
START_US = at(11)  # after the stream's samples


def gpu_p0(minute: int, count: int, util: int) -> Item:
    """GPU-p0 (job-1's) at `util` % for `count` minutes from `minute` after `START_US`."""
    return (
        SAMPLES,
        0,
        encode_batch(
            [
                an_envelope(
                    gpu_uuid="GPU-p0",
                    sample_time_us=START_US + m * MINUTE_US,
                    interval_us=MINUTE_US,
                    util_gpu_pct=util,
                    processes=(a_process(sm=util, owner=JOB_1),),
                )
                for m in range(minute, minute + count)
            ]
        ),
    )


# the watermark past the stream's releases: job-7's usage moves its baseline (a retry's below)
SETTLED = ShardsSealedThrough(
    at(10), ("samples-0",), (JobUsage("job-7", Unit.MONEY, 1_234),), (), "ledger", "sealed", at(10)
)
BEFORE: tuple[tuple[Item, ...], ...] = (
    *STREAM,
    (gpu_p0(0, 15, 1),),  # below the threshold for a quarter of an hour
    (gpu_p0(15, 20, 2), jobs(hold("job-11", "vision", 9_000, 111))),  # idle: over 30 minutes
    (gpu_p0(35, 5, 80), admin(SETTLED)),  # busy again; the holds released at 9 settled
)
AFTER: tuple[tuple[Item, ...], ...] = (
    (samples(0, 1), samples(0, 7), gpu_p0(15, 10, 2)),  # resent: forgotten, and known
    (admin(PriceSet(MODEL, None, 9_000_000, *META, START_US + 40 * MINUTE_US)), gpu_p0(40, 5, 60)),
    (
        jobs(hold("job-12", "language", 4_000, 400)),
        jobs(hold("job-7", "vision", 2_000, 401)),  # a retry: past its job's baseline
        admin(BudgetGranted("language", "2026-12", Unit.MONEY, 70_000, *META, at(400))),
        gpu_p0(45, 5, 1),
    ),
)
BATCHES = located((*BEFORE, *AFTER))
MOVE = len(BEFORE)
SEALED_AFTER = (2, 5)  # the batches the first writer seals after (and at the hand-over)


def settings(data_dir: Path, store: LocalObjectStore) -> ShardSettings:
    return ShardSettings(data_dir, store, REPLAY, OUTPUTS, SAMPLES, 0.0, None)


def mine(spec: ShardSpec, batch: list[ConsumedMessage]) -> list[ConsumedMessage]:
    return [m for m in batch if m.topic != SAMPLES or m.partition == spec.partition]


@dataclass(frozen=True)
class Written:
    """A shard as its first writer handed it over: the store, the snapshot of each of its
    seals (before the hand-over) and the sealed ledger of the first, pulled."""

    store: LocalObjectStore
    snapshots: tuple[bytes, ...]
    first_seal: Path


def write(root: Path, spec: ShardSpec) -> Written:
    store = LocalObjectStore(root / "objects")
    remote = remote_of(store, spec.name)
    shard = open_shard(settings(root / "a", store), spec, INC)
    snapshots: list[bytes] = []
    for index, batch in enumerate(BATCHES[:MOVE]):
        shard.ingestor.apply(mine(spec, batch))
        if index not in SEALED_AFTER:
            continue
        shard.store.seal()
        shard.store.prune_seen_events(WINDOW_US)
        cache = root / ("first-seal" if not snapshots else f"seal-{index}")
        _, raw = pull_ledger_with(remote, cache, SNAPSHOT_NAME)
        assert raw is not None
        snapshots.append(raw)
    close_shard(shard, 500_000, 8)
    return Written(store, tuple(snapshots), root / "first-seal")


@pytest.fixture(scope="module")
def written() -> Iterator[Callable[[ShardSpec], Written]]:
    """Each shard written once for the module (the tests only read it), in memory where there
    is some (every seal and publish syncs its files)."""
    done: dict[str, Written] = {}
    with tempfile.TemporaryDirectory(dir=SCRATCH) as root:

        def of(spec: ShardSpec) -> Written:
            if spec.name not in done:
                done[spec.name] = write(Path(root) / spec.name, spec)
            return done[spec.name]

        yield of


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """A fresh directory, in memory where there is some."""
    with tempfile.TemporaryDirectory(dir=SCRATCH) as root:
        yield Path(root)


# what only a wall clock tells apart, and what is owed to the broker rather than folded
STAMPED = {
    "source_ranges": "committed_at_us",
    "admin_log": "applied_at_us",
    "closed_periods": "closed_at_us",
    "dead_letters": "recorded_at_us",
}
NOT_STATE = ("outbox", "undeliverable")
# what a writer reads of its applied ranges (a snapshot keeps one range per source partition)
RANGES = (
    'SELECT incarnation, topic, "partition", max(last_offset), max(batch_seq), bool_and(sealed) '
    "FROM source_ranges GROUP BY ALL"
)


def state(data_dir: Path) -> dict[str, list[tuple[object, ...]]]:
    """Every table of the hot database, row by row (sorted), less the stamps."""
    con = duckdb.connect(str(data_dir / HOT_DB_NAME), read_only=True)
    try:
        names = [
            str(r[0])
            for r in con.execute(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = 'main' AND table_type = 'BASE TABLE'"
            ).fetchall()
        ]
        found = {}
        for name in sorted(set(names) - set(NOT_STATE)):
            columns = f"* EXCLUDE ({STAMPED[name]})" if name in STAMPED else "*"
            query = RANGES if name == "source_ranges" else f"SELECT {columns} FROM {name}"
            found[name] = con.execute(f"{query} ORDER BY ALL").fetchall()
        found["postings"] = con.execute("SELECT * FROM postings ORDER BY ALL").fetchall()
        return found
    finally:
        con.close()


def fold_after(data_dir: Path, spec: ShardSpec) -> int:
    """The batches after the move folded into the shard taken up in `data_dir`, after a prune
    of the dedupe window (the new owner's first seal's); how many ids the prune forgot."""
    with DuckDBStore(data_dir) as store:
        forgot = store.prune_seen_events(WINDOW_US)
        ingestor = Ingestor(
            store, INC, PRICES, CENTRES, topics=OUTPUTS, inputs=REPLAY.inputs, role=spec.role
        )
        for batch in BATCHES[MOVE:]:
            ingestor.apply(mine(spec, batch))
        return forgot


@pytest.mark.parametrize("spec", [samples_shard(0), GLOBAL], ids=["samples-shard", "global-shard"])
def test_a_shard_taken_up_from_its_snapshot_is_the_one_its_archive_replays(tmp_path, spec, written):
    shard = written(spec)
    remote = remote_of(shard.store, spec.name)
    replay_settings = replace(REPLAY, role=spec.role)

    from_snapshot = restore(tmp_path / "snapshot" / spec.name, remote, replay_settings)
    replayed = restore(tmp_path / "replay" / spec.name, remote, replay_settings, snapshot=False)
    ways = [tmp_path / way / spec.name for way in ("snapshot", "replay")]
    archived = archive_batch_count(ways[1])[0]
    assert from_snapshot == Restored(0, 1)
    assert replayed.snapshot is None and replayed.batches == archived
    if spec.role is ShardRole.SAMPLES:  # and from an older snapshot: the same code for both
        ways.append(tmp_path / "behind" / spec.name)
        assert pull_ledger_with(remote, ways[2], SNAPSHOT_NAME)[0]
        caught_up = take_up(shard.snapshots[1], ways[2], replay_settings)  # after the close
        at_seal = archive_batch_count(shard.first_seal.parent / f"seal-{SEALED_AFTER[1]}")[0]
        assert caught_up.batches == archived - at_seal > 0  # every batch after that seal
    taken = [state(d) for d in ways]
    assert taken[0]["seen_events"] and taken[0]["source_ranges"]  # not an empty comparison
    if spec.role is ShardRole.GLOBAL:
        assert taken[0]["open_holds"] and taken[0]["admin_log"] and taken[0]["closed_periods"]
        assert taken[0]["hold_baselines"] == [("job-7", Unit.MONEY.value, 1_234)]
    else:
        assert taken[0]["idle_state"] and taken[0]["gpu_holdings"] and taken[0]["job_owners"]
    assert all(other == taken[0] for other in taken[1:])

    forgot = {fold_after(directory, spec) for directory in ways}
    assert len(forgot) == 1 and (spec.role is ShardRole.GLOBAL or forgot.pop() > 0)
    folded = [state(d) for d in ways]
    assert len(folded[0]["postings"]) > len(taken[0]["postings"])  # the next batches posted
    assert all(other == folded[0] for other in folded[1:])
    if spec.role is ShardRole.GLOBAL:  # the retry's hold starts past its job's baseline
        retried = [(r[4], r[7], r[8]) for r in folded[0]["open_holds"] if r[0] == "job-7"]
        assert retried == [(2_000, 1_234, 0)]


def test_a_fenced_writers_snapshot_is_never_loaded(tmp_path):
    store = LocalObjectStore(tmp_path / "objects")
    spec = samples_shard(0)
    remote = remote_of(store, spec.name)
    batches = [mine(spec, b) for b in located(STREAM)]
    first = open_shard(settings(tmp_path / "a", store), spec, INC)
    first.ingestor.apply(batches[0])
    first.store.seal()
    second = open_shard(settings(tmp_path / "b", store), spec, INC)  # claims: epoch 2
    first.ingestor.apply(batches[1])
    fenced_at = first.next_offset(SAMPLES)
    with pytest.raises(WriterFenced):
        first.store.seal()  # stores its snapshot; its head is refused
    first.store.close()
    head = published_head(remote)
    assert head is not None
    named = version_key(SNAPSHOT_NAME, head.file_map()[SNAPSHOT_NAME])
    stored = [o.key for o in remote.list(f"versions/{SNAPSHOT_NAME}/")]
    assert named in stored and len(stored) == 2
    (fenced,) = (remote.get(key) for key in stored if key != named)  # stored, named by no head

    third = open_shard(settings(tmp_path / "c", store), spec, INC)
    assert third.restored == Restored(0, 1)  # the first writer's, from before it was fenced
    assert third.next_offset(SAMPLES) == second.next_offset(SAMPLES) < fenced_at
    local = tmp_path / "c" / "shards" / spec.name / SNAPSHOT_NAME
    assert local.read_bytes() == read_published(remote, SNAPSHOT_NAME) != fenced
    for shard in (second, third):
        shard.store.close()


def test_a_head_that_names_no_snapshot_is_replayed(tmp_path, caplog):
    """A shard sealed before snapshots (its writer published none)."""
    store = LocalObjectStore(tmp_path / "objects")
    remote = remote_of(store, "samples-0")
    local = tmp_path / "a"
    with PublishedStore(local, Publisher(local, remote)) as writer:
        ingestor = Ingestor(writer, INC, PRICES, CENTRES, inputs=REPLAY.inputs)
        for batch in located(STREAM)[:1]:
            ingestor.apply(mine(samples_shard(0), batch))
            writer.seal()
    assert read_published(remote, SNAPSHOT_NAME) is None
    with caplog.at_level(logging.WARNING, "tally.worker"):
        restored = restore(tmp_path / "b" / "samples-0", remote, REPLAY)
    assert (restored.snapshot, restored.batches) == (None, archive_batch_count(local)[0])
    assert "names no snapshot" in caplog.text
    assert (tmp_path / "b" / "samples-0" / SNAPSHOT_NAME).is_file()  # published at its next seal


def without_table(raw: bytes, name: str) -> bytes:
    """The snapshot `raw` without its table `name` (as one taken before the table existed)."""
    members = {}
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        for member in tar.getmembers():
            handle = tar.extractfile(member)
            assert handle is not None
            members[member.name] = handle.read()
    meta = orjson.loads(members.pop("snapshot.json"))
    meta["tables"].remove(name)
    del members[f"{name}.parquet"]
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for member, data in [("snapshot.json", orjson.dumps(meta)), *members.items()]:
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        pytest.param("later-on-first-seal", "past the sealed ledger on admin", id="ahead"),
        pytest.param("first-on-later", "closes a period", id="a-period-closed-after-it"),
        pytest.param("cut-short", "unreadable", id="cut-short"),
        pytest.param("missing-table", "no table balances", id="a-table-missing"),
    ],
)
def test_a_snapshot_that_does_not_fit_its_sealed_ledger_is_refused_with_the_reason(
    tmp_path, written, case, reason
):
    shard = written(samples_shard(0))
    remote = remote_of(shard.store, "samples-0")
    pulled = tmp_path / "pulled"
    found, raw = pull_ledger_with(remote, pulled, SNAPSHOT_NAME)
    assert found and raw is not None
    if case == "later-on-first-seal":  # the handed-over snapshot on the first seal's ledger
        pulled = tmp_path / "first-seal"
        shutil.copytree(shard.first_seal, pulled)
    snapshot = {
        "later-on-first-seal": raw,
        "first-on-later": shard.snapshots[0],  # its batches after include the close
        "cut-short": raw[: len(raw) // 2],
        "missing-table": without_table(raw, "balances"),
    }[case]
    manifests = local_manifests(pulled)
    with pytest.raises(SnapshotMismatch, match=reason):
        take_up(snapshot, pulled, REPLAY)
    assert not (pulled / HOT_DB_NAME).exists()
    assert local_manifests(pulled) == manifests  # the sealed ledger as pulled: replayed next
