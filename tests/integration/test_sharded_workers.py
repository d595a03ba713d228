"""Several workers, one ledger (`ledger.sharded: true`): two `tally worker` processes in one
consumer group share a 4-partition samples topic, each writing the shards of its partitions to
one segments store (a local directory). One is SIGKILLed mid-ingest and restarted: its
partitions move to the other and back (each move restores the shard from its head and refolds
what was not sealed). The union readers see (`pull`) must then hold every sample once — GPU-ms
per team and GPU, and every balance, exactly what was produced — and `tally ledger verify`
must pass on it. Two holds placed and released on the jobs topic are settled once by the global
shard when the shards' watermark (which the global shard's holder publishes after its seals)
passes their end: one by its job's usage, one with no usage released whole, so the hold accounts
net to zero as in a whole ledger. A third job's hold, twice its usage, stays open (the job still
runs): the scheduler-visible budget of its team (granted on the admin topic) must be what a
whole ledger shows, its usage consumed once and the hold projected as `hold − usage so far`
(`ledger.hold_projection`), not counted again inside the whole hold. The balances topic's
per-shard messages, summed per account as the scheduler sums them, are the union's balances.

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
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer

from ledger.admin import BudgetGranted, admin_envelope, encode_admin
from ledger.admin.effects import grant_transaction
from ledger.attribution import attribute_sample
from ledger.balances import BalanceUpdate, BudgetLine, BudgetStatus, decode_balance_update
from ledger.events import Envelope
from ledger.holds import HoldPlaced, HoldReleased, encode_hold, hold_envelope
from ledger.read.queries import LedgerQueries
from ledger.shard_balances import ShardBalances
from ledger.store.objects import LocalObjectStore
from ledger.store.union import shard_heads, union_shards
from ledger.units import Unit
from tally.config import TallyConfig
from tests.builders import T0_US
from tests.conftest import child_env, create_topics, tally_command
from tests.integration.sharded_support import holding, sharded_config, union_of
from tests.integration.support import (
    Expected,
    WorkerProcess,
    fleet_of,
    gpu_ms_by_team_and_gpu,
    load,
    produce,
    rounds,
    send_messages,
    wait_until,
)

pytestmark = [pytest.mark.broker, pytest.mark.slow]

ROUNDS = 100  # × 32 GPUs: 3,200 samples
PACK = 4
RELEASED_US = T0_US + 10 * 10_000_000  # the holds' end: the fleet's tenth round
IDLE_HOLD = 3_600_000  # GPU-ms held for a job that never runs
GRANT_META = ("alice", "the running job's budget", T0_US)


def usage_count(union: Path) -> int:
    rows = LedgerQueries(union)._query(
        "SELECT count(DISTINCT txn_id) FROM {postings} WHERE kind = 'usage'"
    )
    return int(rows[0][0])


def sealed_samples(store: Path, cache: Path) -> int:
    if not shard_heads(LocalObjectStore(str(store))):
        return 0
    return usage_count(union_of(store, cache))


@dataclass(frozen=True, slots=True)
class Running:
    """A job that runs to the end with a hold of twice its usage (`used`, money), of `team`,
    whose budget `granted` is sent on the admin topic."""

    job: str
    team: str
    used: int
    granted: BudgetGranted

    @property
    def hold(self) -> int:
        return 2 * self.used


def consumer_money(config: TallyConfig, batches: list[list[Envelope]]) -> Counter:
    """Consumer money of the distinct samples per (job, team, period, end time)."""
    used: Counter = Counter()
    seen: set[str] = set()
    for envelope in (e for batch in batches for e in batch):
        if envelope.id in seen:
            continue
        seen.add(envelope.id)
        txn = attribute_sample(envelope, config.price_book(), config.organisation.cost_centre_of())
        for p in txn.postings:
            if p.account.startswith("consumer:") and p.unit is Unit.MONEY:
                used[(p.job_id, p.team, txn.period, txn.end_us)] += p.amount
    return used


def money_by_job(
    config: TallyConfig, batches: list[list[Envelope]], until_us: int | None = None
) -> dict[tuple[str, str], int]:
    """Consumer money per (job, team) of the distinct samples (ending by `until_us`)."""
    used: Counter = Counter()
    for (job, team, _, end_us), amount in consumer_money(config, batches).items():
        if job and team and (until_us is None or end_us <= until_us):
            used[(job, team)] += amount
    return dict(used)


def holds_for(config: TallyConfig, batches: list[list[Envelope]]) -> tuple[list, dict, Running]:
    """Hold events for the jobs topic, and the hold postings the union must end with, per
    (kind, job): (sum on `hold:<team>`, transactions). The busiest job by money up to
    `RELEASED_US` holds exactly that usage, so it is settled whole whatever the watermark past
    its end; a job with no usage holds GPU-ms, released whole. Both released at `RELEASED_US`.
    The busiest other job (`Running`) is never released: its hold stays open."""
    used = money_by_job(config, batches, RELEASED_US)
    (job, team), amount = max(used.items(), key=lambda item: (item[1], item[0]))
    others = {k: v for k, v in money_by_job(config, batches).items() if k[0] != job}
    (other, other_team), total = max(others.items(), key=lambda item: (item[1], item[0]))
    granted = BudgetGranted(other_team, "2026-11", Unit.MONEY, 100 * total, *GRANT_META)
    running = Running(other, other_team, total, granted)
    far = T0_US + 86_400 * 10**6
    events = [
        HoldPlaced(job, team, None, Unit.MONEY, amount, far, T0_US),
        HoldPlaced("idle-job", "search", None, Unit.GPU_MS, IDLE_HOLD, far, T0_US),
        HoldPlaced(other, other_team, None, Unit.MONEY, running.hold, far, T0_US),
        HoldReleased(job, RELEASED_US, "completed"),
        HoldReleased("idle-job", RELEASED_US, "cancelled"),
    ]
    settled = {
        ("hold", job): (amount, 1),
        ("hold_settle", job): (-amount, 1),
        ("hold", "idle-job"): (IDLE_HOLD, 1),
        ("hold_release", "idle-job"): (-IDLE_HOLD, 1),
        ("hold", other): (running.hold, 1),  # open: the job runs on
    }
    return [encode_hold(hold_envelope(e)) for e in events], settled, running


def hold_postings(union: Path) -> dict[tuple[str, str], tuple[int, int]]:
    rows = LedgerQueries(union)._query(
        "SELECT kind, job_id, sum(amount), count(DISTINCT txn_id) FROM {postings} "
        "WHERE account LIKE 'hold:%' GROUP BY ALL"
    )
    return {(kind, job): (int(total), int(n)) for kind, job, total, n in rows}


def holds_settled(store: Path, cache: Path, running: str) -> bool:
    union = union_of(store, cache)
    nets = LedgerQueries(union)._query(
        "SELECT count(*), coalesce(sum(amount), 0) FROM {postings} "
        "WHERE account LIKE 'hold:%' AND job_id <> ?",
        [running],
    )[0]
    return nets[0] > 2 and nets[1] == 0  # placed, then settled and released


def summed_balances(
    bootstrap: str, topic: str
) -> tuple[dict[tuple[str, str], int], dict[str, BudgetStatus]]:
    """The balances topic as the scheduler reads it: every shard's messages summed per account
    (`ledger.shard_balances`), the last sum of each account; its nonzero totals per unit, and
    each team's budget as the scheduler's dispatcher takes it."""

    async def read() -> dict[str, BalanceUpdate]:
        consumer = AIOKafkaConsumer(
            topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest"
        )
        await consumer.start()
        shards, last = ShardBalances(), {}
        try:
            while batch := await consumer.getmany(timeout_ms=1000):
                for records in batch.values():
                    for record in records:
                        for merged in shards.merge(decode_balance_update(record.value)):
                            last[merged.account] = merged
        finally:
            await consumer.stop()
        return last

    last = asyncio.run(read())
    totals = {
        (account, unit): total
        for account, update in last.items()
        for unit, total in update.totals
        if total
    }
    budgets = {u.budget.team: u.budget for u in last.values() if u.budget is not None}
    return totals, budgets


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
    holds, settled, running = holds_for(config, batches)
    asyncio.run(send_messages(broker.bootstrap, config.topics.jobs, holds))
    granted = encode_admin(admin_envelope(running.granted))
    asyncio.run(send_messages(broker.bootstrap, config.topics.admin, [granted]))
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
        # the global shard's holder publishes the watermark past the holds' end, folds it
        wait_until(
            lambda: holds_settled(store, cache, running.job), 30, "the holds to be settled", b
        )
        time.sleep(1.0)  # anything counted twice would show in a later seal
        a.assert_alive()
        b.assert_alive()
    finally:
        a.stop()
        b.stop()
    union = union_of(store, cache)
    assert union_shards(union) == ["global", *(f"samples-{p}" for p in range(4))]
    assert usage_count(union) == expected.samples
    used = {k: v for k, v in gpu_ms_by_team_and_gpu(union).items() if k[1] is not None}
    assert used == expected.gpu_ms_by_team_and_gpu()  # (a hold's postings name no GPU)
    balances = LedgerQueries(union).balances()
    produced = Counter(expected.balances())
    grant = grant_transaction(admin_envelope(running.granted), expected.centres.get(running.team))
    for p in grant.postings:
        produced[(p.account, p.unit.value)] += p.amount
    assert {k: v for k, v in balances.items() if not k[0].startswith("hold")} == produced
    assert hold_postings(union) == settled  # each settled or released once, at its end
    summed, budgets = summed_balances(broker.bootstrap, config.topics.balances)
    assert {k: v for k, v in balances.items() if v} == summed
    # the running job's team as the scheduler sees it: what a whole ledger shows, whose usage
    # settles the hold as it comes (min(usage, hold)), the rest still held
    status = budgets[running.team]
    consumed = sum(
        amount
        for (_, team, period, _), amount in consumer_money(config, batches).items()
        if team == running.team and period == status.period == running.granted.period
    )
    money = status.line(Unit.MONEY.value)
    assert money is not None
    whole_ledger = BudgetLine(
        Unit.MONEY.value,
        running.granted.amount,
        consumed,
        running.hold - min(running.hold, running.used),
    )
    assert money == whole_ledger
    moved = a.log.read_text() + b.log.read_text()
    # a shard moved with sealed work and was restored, from the snapshot its head names
    assert "restored from its snapshot" in moved
    assert "by replaying its archive" not in moved
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
    assert usage_count(union) == expected.samples
    assert gpu_ms_by_team_and_gpu(union) == expected.gpu_ms_by_team_and_gpu()
    verified = verify(tmp_path, store)
    assert verified.returncode == 0, verified.stdout + verified.stderr
