"""A shard moving between workers (`streams.shards`), in process on a local directory store:
which shards an assignment gives (a table), a shard taken up by a second worker from what the
first sealed (restored, claimed, fetched from the sealed offset: the first's unsealed work is
folded again, never twice), the first fenced, and a worker taking up again a shard nobody wrote
since keeping its own directory; and a sharded worker whose shard is fenced dropping that shard
and going on with the others."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from ledger.ingest import OutputTopics, ShardRole
from ledger.store.head import WriterFenced
from ledger.store.hot import DuckDBStore
from ledger.store.objects import LocalObjectStore
from ledger.store.rebuild import ReplaySettings
from ledger.store.replica import pull
from ledger.store.union_rebuild import role_of
from streams import sharded_worker, shards
from streams.sharded_worker import ShardedWorker
from streams.shards import (
    GLOBAL,
    GLOBAL_PARTITION,
    Restored,
    Shard,
    ShardSettings,
    close_shard,
    drop_shard,
    open_shard,
    samples_shard,
    shard_dir,
    shards_for,
)
from streams.worker import WorkerSettings
from tests.unit.test_ledger_on_s3 import totals
from tests.unit.test_shard_wiring import a_worker
from tests.unit.test_store import PRICES, TOPIC, ingest, message

INC = "cluster-a"


@pytest.mark.parametrize(
    ("partitions", "names"),
    [
        pytest.param([], [], id="none"),
        pytest.param([3, 1], ["samples-1", "samples-3"], id="odd-partitions"),
        pytest.param([2, 0], ["global", "samples-0", "samples-2"], id="partition-0-brings-global"),
        pytest.param([0], ["global", "samples-0"], id="only-partition-0"),
    ],
)
def test_an_assignment_gives_one_shard_per_partition_and_the_global_one_with_partition_0(
    partitions, names
):
    specs = shards_for(partitions)
    assert [s.name for s in specs] == names
    assert {s.role for s in specs if s.partition is not None} <= {ShardRole.SAMPLES}
    assert [s.role for s in specs if s.partition is None] == [ShardRole.GLOBAL] * (0 in partitions)


def settings(data_dir: Path, store: LocalObjectStore) -> ShardSettings:
    return ShardSettings(
        data_dir=data_dir,
        store=store,
        replay=ReplaySettings(PRICES, {"vision": "research"}),
        outputs=OutputTopics(),
        samples_topic=TOPIC,
        grace_s=0.0,
        memory_limit=None,
    )


MESSAGES = [message(i, 2 * i, 2 * i + 1, partition=2) for i in range(6)]


def test_a_moved_shard_starts_from_what_was_sealed_and_its_old_writer_is_fenced(tmp_path):
    store = LocalObjectStore(tmp_path / "objects")
    spec = samples_shard(2)
    first = open_shard(settings(tmp_path / "a", store), spec, INC)
    first.ingestor.apply(MESSAGES[:3])
    first.store.seal()  # published: offsets 0-2
    first.ingestor.apply(MESSAGES[3:5])  # committed, not sealed
    assert first.next_offset(TOPIC) == 5

    second = open_shard(settings(tmp_path / "b", store), spec, INC)
    assert second.restored == Restored(batches=0, snapshot=1)  # the first's seal, epoch 1
    assert second.next_offset(TOPIC) == 3  # the sealed offset, not what the first applied
    with pytest.raises(WriterFenced):
        first.store.seal()
    drop_shard(tmp_path / "a", first)
    assert not shard_dir(tmp_path / "a", spec.name).exists()

    second.ingestor.apply(MESSAGES[3:])  # the first's unsealed work, folded again, and more
    close_shard(second, 500_000, 8)
    whole = tmp_path / "whole"
    with DuckDBStore(whole) as writer:
        ingest(writer, *MESSAGES)
        writer.seal()
    assert totals(pull(store, tmp_path / "reader")) == totals(whole)


def test_a_shard_taken_up_again_by_its_last_writer_keeps_its_directory(tmp_path):
    store = LocalObjectStore(tmp_path / "objects")
    spec = samples_shard(0)
    shard = open_shard(settings(tmp_path / "a", store), spec, INC)
    shard.ingestor.apply([message(0, 1, partition=0), message(1, 2, partition=0)])
    close_shard(shard, 500_000, 8)  # handed over: sealed and published

    again = open_shard(settings(tmp_path / "a", store), spec, INC)
    assert (again.restored, again.next_offset(TOPIC)) == (Restored(), 2)
    assert again.store.publisher.writer is not None
    assert again.store.publisher.writer.epoch == 2  # claimed anew all the same
    again.store.close()


def test_a_sharded_worker_drops_a_fenced_shard_and_keeps_the_others(tmp_path):
    store = LocalObjectStore(tmp_path / "objects")
    worker = ShardedWorker(
        WorkerSettings(
            bootstrap=("127.0.0.1:1",),
            group_id="test",
            samples_topic=TOPIC,
            deadletter_topic="deadletter",
            alerts_topic="alerts",
            data_dir=tmp_path / "a",
            prices=PRICES,
            cost_centres={"vision": "research"},
            sharded=True,
            segments_store=store,
        )
    )
    for partition in (0, 1):
        shard = open_shard(worker.shard_settings, samples_shard(partition), INC)
        shard.ingestor.apply([message(0, 1, partition=partition, gpu=f"GPU-{partition}")])
        worker.shards[shard.spec.name] = shard
    open_shard(settings(tmp_path / "b", store), samples_shard(1), INC).store.close()  # claimed

    asyncio.run(worker.seal())  # samples-1's publish is fenced: dropped, not the process

    assert list(worker.shards) == ["samples-0"]
    assert not shard_dir(tmp_path / "a", "samples-1").exists()
    assert worker.stats.segments_sealed == 1  # samples-0 sealed and published as before
    worker._close()


@pytest.mark.parametrize(
    ("path", "role"),
    [
        pytest.param("data", ShardRole.WHOLE, id="a-ledger"),
        pytest.param("data/replica", ShardRole.WHOLE, id="a-read-cache"),
        pytest.param("data/replica/shards/global", ShardRole.GLOBAL, id="the-global-shard"),
        pytest.param("data/shards/samples-12", ShardRole.SAMPLES, id="a-samples-shard"),
        pytest.param("data/shards/_root", ShardRole.WHOLE, id="the-root-ledger-beside-shards"),
        pytest.param("data/shards/samples-x", ShardRole.WHOLE, id="not-a-partition"),
    ],
)
def test_a_shard_directory_is_rebuilt_with_its_shards_role(path, role):
    assert role_of(Path(path)) == role


def test_a_head_published_between_restore_and_claim_is_taken_up_not_overwritten(
    tmp_path, monkeypatch
):
    """The previous owner seals once more after the new owner restored and before it claimed:
    the claimed head names that seal, so the new owner restores again (under its claim) rather
    than publish the older state over it, and a handover right away loses nothing."""
    store = LocalObjectStore(tmp_path / "objects")
    spec = samples_shard(2)
    first = open_shard(settings(tmp_path / "a", store), spec, INC)
    first.ingestor.apply(MESSAGES[:3])
    first.store.seal()  # published: offsets 0-2
    first.ingestor.apply(MESSAGES[3:5])  # committed; sealed only once the second restored
    real_restore = shards.restore
    restores: list[int] = []

    def restore_then_the_first_seals(*args, **kwargs):
        restores.append(real_restore(*args, **kwargs))
        if len(restores) == 1:
            first.store.seal()  # published: offsets 0-4, between the restore and the claim
        return restores[-1]

    monkeypatch.setattr(shards, "restore", restore_then_the_first_seals)
    second = open_shard(settings(tmp_path / "b", store), spec, INC)

    taken_up_at = second.next_offset(TOPIC)
    drop_shard(tmp_path / "a", first)  # fenced: nothing of it is read
    close_shard(second, 500_000, 8)  # revoked at once: nothing folded again yet
    whole = tmp_path / "whole"
    with DuckDBStore(whole) as writer:
        ingest(writer, *MESSAGES[:5])
        writer.seal()
    assert totals(pull(store, tmp_path / "reader")) == totals(whole)
    assert taken_up_at == 5  # what the claimed head names, not the older one


def test_a_revocation_during_a_take_up_does_not_wait_for_it_and_the_shard_is_given_back(
    tmp_path, monkeypatch
):
    """The take-up (a restore can take long) runs outside the worker's lock: the rebalance's
    revocation goes through meanwhile, and the shard taken up for the revoked assignment is
    closed, not held."""
    store = LocalObjectStore(tmp_path / "objects")
    worker = a_worker(tmp_path / "a", store)
    worker._incarnation = INC
    entered, release = threading.Event(), threading.Event()
    taken: list[Shard] = []

    def slow_open(*args, **kwargs):
        entered.set()
        release.wait(5)
        taken.append(open_shard(*args, **kwargs))
        return taken[-1]

    monkeypatch.setattr(sharded_worker, "open_shard", slow_open)

    async def scenario() -> None:
        task = asyncio.create_task(worker._take_up_shards())
        await worker.assigned({GLOBAL_PARTITION})
        assert await asyncio.to_thread(entered.wait, 5)
        await asyncio.wait_for(worker.revoked(set()), 2)  # not held up by the take-up
        release.set()
        while not taken:
            await asyncio.sleep(0.01)
        async with worker._lock:  # the take-up's last step done
            await asyncio.sleep(0.05)
        async with worker._lock:
            assert worker.shards == {}
        task.cancel()

    asyncio.run(scenario())
    again = open_shard(settings(tmp_path / "b", store), GLOBAL, INC)  # given back: claimable
    assert again.store.publisher.writer is not None
    assert again.store.publisher.writer.epoch == 2
    again.store.close()
