"""Several workers, one ledger (`ledger.sharded: true`): two `tally worker` processes in one
consumer group share a 4-partition samples topic, each writing the shards of its partitions to
one segments store (a local directory). One is SIGKILLed mid-ingest and restarted: its
partitions move to the other and back (each move restores the shard from its head and refolds
what was not sealed). The union readers see (`pull`) must then hold every sample once — GPU-ms
per team and GPU, and every balance, exactly what was produced — and `tally ledger verify`
must pass on it.

The soak (`TALLY_SOAK=1`) adds a worker paused past its session timeout (SIGSTOP) while it holds
unsealed rows, then woken (SIGCONT): its shards were taken up by the other from their heads, so
its next publish is fenced and the shards dropped, and nothing it wrote is read."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from ledger.read.queries import LedgerQueries
from ledger.store.union import union_shards
from tests.conftest import child_env, create_topics, tally_command
from tests.integration.sharded_support import holding, sealed_samples, sharded_config, union_of
from tests.integration.support import (
    Expected,
    WorkerProcess,
    fleet_of,
    gpu_ms_by_team_and_gpu,
    load,
    produce,
    rounds,
    wait_until,
)

pytestmark = [pytest.mark.broker, pytest.mark.slow]

ROUNDS = 100  # × 32 GPUs: 3,200 samples
PACK = 4


def test_two_sharded_workers_with_a_sigkill_keep_one_exact_ledger(broker, tmp_path):
    store = tmp_path / "store"
    for folder in (store, tmp_path / "b-config", tmp_path / "reader-config"):
        folder.mkdir()
    config, path_a = load(tmp_path, sharded_config(tmp_path, "a", store))
    _, path_b = load(tmp_path / "b-config", sharded_config(tmp_path, "b", store))
    create_topics(broker.bootstrap, list(config.topics.all().values()), 4)
    fleet = fleet_of(config)
    expected = Expected(config)
    batches = rounds(fleet, 0, ROUNDS)
    for batch in batches:
        expected.add(batch)
    a = WorkerProcess(path_a, broker.bootstrap, tmp_path / "a.log").start()
    b = WorkerProcess(path_b, broker.bootstrap, tmp_path / "b.log").start()
    failure: list[BaseException] = []

    def producer() -> None:
        try:
            asyncio.run(produce(broker.bootstrap, config.topics.samples, batches, PACK, 0.15))
        except BaseException as exc:  # surfaced below
            failure.append(exc)

    thread = threading.Thread(target=producer, daemon=True)
    cache = tmp_path / "reader"
    try:
        wait_until(lambda: holding(a) and holding(b), 60, "both to hold shards", b)
        thread.start()
        wait_until(
            lambda: sealed_samples(store, cache) >= expected.samples // 4, 60, "a quarter", a
        )
        a.kill()  # mid-ingest: its unsealed rows are lost with it, refolded by their next owner
        # past the session timeout b takes a's partitions up from their heads
        wait_until(
            lambda: any("samples-0, samples-1, samples-2, samples-3" in h for h in holding(b)),
            30,
            "b to hold every shard",
            b,
        )
        a.start()  # its restart moves some partitions back: restored from b's heads
        wait_until(lambda: len(holding(a)) == 2, 60, "a to hold shards again", a)
        thread.join(120)
        assert not thread.is_alive() and not failure, failure
        wait_until(
            lambda: sealed_samples(store, cache) == expected.samples,
            60,
            f"all {expected.samples} samples in the union",
            b,
        )
        time.sleep(1.0)  # anything counted twice would show in a later seal
        a.assert_alive()
        b.assert_alive()
    finally:
        a.stop()
        b.stop()
    union = union_of(store, cache)
    assert union_shards(union) == ["global", *(f"samples-{p}" for p in range(4))]
    assert LedgerQueries(union).transaction_count() == expected.samples
    assert gpu_ms_by_team_and_gpu(union) == expected.gpu_ms_by_team_and_gpu()
    assert LedgerQueries(union).balances() == expected.balances()
    moved = a.log.read_text() + b.log.read_text()
    assert "restored from" in moved  # a shard moved with sealed work and was restored
    reader = load(tmp_path / "reader-config", sharded_config(tmp_path, "reader", store))[1]
    verified = subprocess.run(
        tally_command("ledger", "verify", "--config", str(reader)),
        capture_output=True,
        text=True,
        env=child_env(),
        check=False,
    )
    assert verified.returncode == 0, verified.stdout + verified.stderr


def verify(tmp: Path, store: Path) -> subprocess.CompletedProcess[str]:
    (tmp / "verify-config").mkdir(exist_ok=True)
    reader = load(tmp / "verify-config", sharded_config(tmp, "verify", store))[1]
    return subprocess.run(
        tally_command("ledger", "verify", "--config", str(reader)),
        capture_output=True,
        text=True,
        env=child_env(),
        check=False,
    )


@pytest.mark.skipif(not os.environ.get("TALLY_SOAK"), reason="the soak: make soak (TALLY_SOAK=1)")
def test_a_worker_paused_past_its_session_is_fenced_and_nothing_it_writes_is_read(broker, tmp_path):
    store = tmp_path / "store"
    for folder in (store, tmp_path / "b-config"):
        folder.mkdir()
    config, path_a = load(tmp_path, sharded_config(tmp_path, "a", store))
    # b seals only when it hands its shards over: paused, it holds unsealed rows
    _, path_b = load(tmp_path / "b-config", sharded_config(tmp_path, "b", store, 60.0))
    create_topics(broker.bootstrap, list(config.topics.all().values()), 4)
    expected = Expected(config)
    batches = rounds(fleet_of(config), 0, ROUNDS)
    for batch in batches:
        expected.add(batch)
    a = WorkerProcess(path_a, broker.bootstrap, tmp_path / "a.log").start()
    b = WorkerProcess(path_b, broker.bootstrap, tmp_path / "b.log").start()
    cache = tmp_path / "reader"
    try:
        wait_until(lambda: holding(a) and holding(b), 60, "both to hold shards", b)
        asyncio.run(produce(broker.bootstrap, config.topics.samples, batches[:50], PACK))
        wait_until(lambda: b.commits() > 0, 30, "b to commit", b)
        assert b.proc is not None
        os.killpg(b.proc.pid, signal.SIGSTOP)
        wait_until(
            lambda: any("samples-0, samples-1, samples-2, samples-3" in h for h in holding(a)),
            30,
            "a to take b's shards up",
            a,
        )
        os.killpg(b.proc.pid, signal.SIGCONT)
        wait_until(lambda: "dropped" in b.log.read_text(), 30, "b to find itself fenced", b)
        asyncio.run(produce(broker.bootstrap, config.topics.samples, batches[50:], PACK))
        wait_until(lambda: len(holding(b)) == 2, 30, "b to take shards up again", b)
        b.assert_alive()  # fenced shards are dropped, the process goes on
        b.stop()  # a clean stop seals and publishes what it holds; a takes the rest up
        wait_until(
            lambda: sealed_samples(store, cache) == expected.samples,
            60,
            f"all {expected.samples} samples in the union",
            a,
        )
        time.sleep(1.0)
    finally:
        a.stop()
        b.stop()
    union = union_of(store, cache)
    assert LedgerQueries(union).transaction_count() == expected.samples
    assert gpu_ms_by_team_and_gpu(union) == expected.gpu_ms_by_team_and_gpu()
    verified = verify(tmp_path, store)
    assert verified.returncode == 0, verified.stdout + verified.stderr
