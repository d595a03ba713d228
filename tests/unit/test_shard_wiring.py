"""The sharded worker's cross-shard wiring (`streams.sharded_worker`), in process on a local
directory store: each shard publishes its balances stamped with its claim, and the holder of
the global shard puts the shards' watermark on the admin topic at each seal — also when the
global shard has nothing new to seal and only other workers' samples shards advanced — once
per watermark; folded back, it settles a released hold once. Each samples shard lists a job's
usage so far with its consumer balances (column-built usage in DuckDB). The admin topic here is the
sender port's in-memory side (`Loopback`); the broker's is `tests/integration/
test_sharded_workers.py`'s."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

from ledger.admin import JobUsage, ShardsSealedThrough, decode_admin_message
from ledger.balances import BalanceUpdate, ShardStamp, decode_balance_update
from ledger.holds import HoldPlaced, HoldReleased, encode_hold, hold_envelope
from ledger.ingest import ConsumedMessage
from ledger.read.queries import LedgerQueries
from ledger.shard_balances import ShardBalances
from ledger.store.objects import LocalObjectStore
from ledger.store.replica import pull
from ledger.units import Unit
from streams.sharded_worker import ShardedWorker
from streams.shards import GLOBAL, Shard, open_shard, samples_shard
from streams.worker import WorkerSettings
from tests.builders import INTERVAL_US, T0_US
from tests.unit.test_store import PRICES, TOPIC, message

INC = "cluster-a"
SAMPLE_MICROS = 10_000  # what one sample of `message` costs (one micro per GPU-ms)
PLACED = HoldPlaced("job-1", "vision", None, Unit.MONEY, 100_000, T0_US + 3600 * 10**6, T0_US)
RELEASED = HoldReleased("job-1", T0_US + INTERVAL_US, "completed")


class Loopback:
    """The admin topic in memory: an `AdminSender` keeping what it is sent, in order."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, bytes]] = []

    async def send_and_wait(self, topic: str, value: bytes, key: bytes) -> object:
        self.sent.append((topic, key, value))
        return len(self.sent)


class Broker:
    """The broker as the worker's `ClusterIdentity` asks it for its incarnation: `answer`
    (None: not reached), counting the questions."""

    def __init__(self, answer: str | None = INC) -> None:
        self.answer = answer
        self.asked = 0

    async def current(self) -> str | None:
        self.asked += 1
        return self.answer


def a_worker(
    data_dir: Path, store: LocalObjectStore, broker: Broker | None = None
) -> ShardedWorker:
    """A sharded worker whose shards stand for the broker incarnation `INC`, asking `broker`
    (one answering `INC` unless given) whether a batch still comes from it."""
    worker = ShardedWorker(
        WorkerSettings(
            bootstrap=("127.0.0.1:1",),
            group_id="test",
            samples_topic=TOPIC,
            deadletter_topic="deadletter",
            alerts_topic="alerts",
            data_dir=data_dir,
            prices=PRICES,
            cost_centres={"vision": "research"},
            admin_topic="admin",
            jobs_topic="jobs",
            balances_topic="balances",
            sharded=True,
            segments_store=store,
        )
    )
    worker._incarnation = INC
    worker._identity = broker or Broker()
    return worker


def balances_of(shard: Shard) -> list[BalanceUpdate]:
    """The balance messages `shard` queued since last asked (then taken as sent)."""
    pending = shard.store.pending_outbox()
    shard.store.mark_sent([m.id for m in pending])
    return [decode_balance_update(m.value) for m in pending if m.topic == "balances"]


def samples_elsewhere(shards: dict[int, Shard], samples: dict[int, int]) -> list[BalanceUpdate]:
    """Another worker's samples shards `shards` fold `samples[p]` more of job-1's samples each
    (one a message, an interval apart from T0 on) and seal; the balances they queued."""
    published: list[BalanceUpdate] = []
    for partition, count in samples.items():
        shard = shards[partition]
        first = shard.ingestor.next_offset(TOPIC, partition)
        shard.ingestor.apply(
            [
                message(first + i, first + i + 1, partition=partition, gpu=f"GPU-{partition}")
                for i in range(count)
            ]
        )
        shard.store.seal()
        published += balances_of(shard)
    return published


def sent_events(loop: Loopback) -> list[ShardsSealedThrough]:
    events = []
    for topic, _, value in loop.sent:
        assert topic == "admin"
        envelopes, dead = decode_admin_message(value)
        assert dead == []
        events += [e.data for e in envelopes if isinstance(e.data, ShardsSealedThrough)]
    return events


def test_the_global_shards_holder_publishes_the_watermark_and_a_released_hold_settles_once(
    tmp_path,
):
    store = LocalObjectStore(tmp_path / "objects")
    worker, other = a_worker(tmp_path / "a", store), a_worker(tmp_path / "b", store)
    loop = Loopback()
    worker.admin_sender = loop
    glob = open_shard(worker.shard_settings, GLOBAL, INC)
    worker.shards[glob.spec.name] = glob
    jobs = [
        ConsumedMessage("jobs", 0, i, encode_hold(hold_envelope(e))[1])
        for i, e in enumerate((PLACED, RELEASED))
    ]
    asyncio.run(worker._apply_to("global", jobs))
    published = balances_of(glob)
    samples = {p: open_shard(other.shard_settings, samples_shard(p), INC) for p in (0, 1)}
    published += samples_elsewhere(samples, {0: 4, 1: 2})  # job-1's usage through T0 + 2
    # each samples shard lists job-1's usage so far with its consumer balance
    lines = {(u.account, u.shard): u.jobs for u in published if u.jobs}
    assert {shard.shard for _, shard in lines if shard} == {"samples-0", "samples-1"}
    so_far = [a.amount for jobs in lines.values() for a in jobs if a.unit == Unit.MONEY.value]
    assert sum(so_far) == 6 * SAMPLE_MICROS
    idle = open_shard(other.shard_settings, samples_shard(2), INC)  # a partition no GPU uses
    idle.ingestor.apply(jobs)  # folded for its views: sealed, with no usage
    idle.store.seal()
    published += balances_of(idle)

    asyncio.run(worker.seal())
    asyncio.run(worker.seal())  # the same watermark: not sent again
    [event] = sent_events(loop)
    assert event.through_us == T0_US + 2 * INTERVAL_US  # the slower shard's newest usage
    assert JobUsage("job-1", Unit.MONEY, 4 * SAMPLE_MICROS) in event.jobs  # two per shard
    assert event.covers == ("job-1",)  # the holds open in the global shard: settled from it
    assert glob.store.open_holds()  # open until the watermark comes back

    admin = [ConsumedMessage("admin", 0, 0, loop.sent[0][2])]
    asyncio.run(worker._apply_to("global", admin))  # as the view feed hands it back
    assert glob.store.open_holds() == {}
    published += balances_of(glob)
    asyncio.run(worker.seal())  # the settlement sealed
    published += samples_elsewhere(samples, {0: 1, 1: 3})  # both shards through T0 + 5
    asyncio.run(worker.seal())  # nothing new in the global shard: the watermark all the same
    assert [e.through_us for e in sent_events(loop)] == [event.through_us, T0_US + 5 * INTERVAL_US]
    worker._close()
    for shard in [*samples.values(), idle]:
        shard.store.close()

    union = pull(store, tmp_path / "reader")
    postings = LedgerQueries(union)._query(
        "SELECT kind, sum(amount) FROM {postings} WHERE account = 'hold:vision' GROUP BY ALL"
    )
    # settled once by job-1's usage up to the first watermark, the rest released
    assert dict(postings) == {
        "hold": 100_000,
        "hold_settle": -4 * SAMPLE_MICROS,
        "hold_release": -(100_000 - 4 * SAMPLE_MICROS),
    }
    # every shard's balances stamped with its claim; summed, they are the union's
    stamps = {u.shard for u in published}
    assert stamps == {ShardStamp(name, 1) for name in ("global", "samples-0", "samples-1")}
    summed = summed_totals(published)
    whole = {k: v for k, v in LedgerQueries(union).balances().items() if v}
    assert summed == whole


def summed_totals(updates: list[BalanceUpdate]) -> dict[tuple[str, str], int]:
    """What a reader of the balances topic sees last per account, summed over the shards."""
    shards = ShardBalances()
    last: dict[str, BalanceUpdate] = {}
    for update in updates:
        for merged in shards.merge(update):
            last[merged.account] = merged
    return {(a, unit): n for a, u in last.items() for unit, n in u.totals if n}


def test_view_events_go_only_to_the_shards_the_fetch_was_positioned_for(tmp_path):
    """A shard taken up while the view feed fetched (from the offset the shards held then
    needed) is not handed that fetch: its events before the fetch's start would be skipped for
    good. It gets them from its own offset at the next fetch."""
    store = LocalObjectStore(tmp_path / "objects")
    worker = a_worker(tmp_path / "a", store)
    held = open_shard(worker.shard_settings, samples_shard(0), INC)
    worker.shards[held.spec.name] = held
    first, later = [
        [ConsumedMessage("jobs", 0, at + i, encode_hold(hold_envelope(e))[1]) for i, e in pair]
        for at, pair in (
            (0, enumerate((PLACED, RELEASED))),
            (2, enumerate((replace(PLACED, job_id="job-2"), replace(RELEASED, job_id="job-2")))),
        )
    ]
    asyncio.run(worker._apply_to(held.spec.name, first))
    holders = dict(worker.shards)  # what the fetch of `later` was positioned for
    glob = open_shard(worker.shard_settings, GLOBAL, INC)  # taken up meanwhile, at offset 0
    worker.shards[glob.spec.name] = glob

    asyncio.run(worker._hand_views(later, holders))
    assert held.ingestor.next_offset("jobs", 0) == 4
    assert glob.ingestor.next_offset("jobs", 0) == 0  # not past the events it has not folded

    asyncio.run(worker._hand_views(first + later, dict(worker.shards)))  # the next fetch
    assert sorted(job for job, _ in glob.store.open_holds()) == ["job-1", "job-2"]
    worker._close()
