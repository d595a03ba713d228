"""Balances of a sharded ledger (`ledger.balances` `ShardStamp`, `ledger.shard_balances`):
a shard's message is keyed by (account, shard) and carries its epoch, a whole ledger's is as
it was; the scheduler sums an account over the shards and ignores a shard's message of an older
epoch (or not newer in its epoch), as a table of message sequences; the dispatcher's budget is
the global shard's with every shard's usage of the team, its open holds projected against their
jobs' usage so far (a table of message sequences: the budget never rises and falls back by the
usage in between, and is the whole ledger's figure at each step); and a stamped shard's
ingestor (a samples shard's too) publishes its balances so keyed."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import orjson
import pytest

from ledger.admin import AdjustmentRecorded
from ledger.balances import (
    BalanceRow,
    BalanceUpdate,
    BudgetLine,
    BudgetStatus,
    JobAmount,
    ShardStamp,
    balance_key,
    decode_balance_update,
    encode_balance_update,
)
from ledger.ingest import Ingestor, InputTopics, OutputTopics
from ledger.ingest.shards import ShardRole
from ledger.pricing import Price, PriceBook
from ledger.shard_balances import ShardBalances
from ledger.store.memory import MemoryStore
from ledger.units import Unit
from tests.builders import T0_US
from tests.unit.test_scheduler_service_support import Rig
from tests.unit.test_shard_roles import admin_message
from tests.unit.test_store import message

ACCOUNT = "consumer:vision/detection"
GPU = Unit.GPU_MS.value


def update(shard: str | None, epoch: int, seq: int, gpu_ms: int) -> BalanceUpdate:
    return BalanceUpdate(
        account=ACCOUNT,
        seq=seq,
        as_of_us=T0_US + seq,
        current_period="2026-11",
        periods=(BalanceRow(ACCOUNT, GPU, "2026-11", gpu_ms),),
        totals=((GPU, gpu_ms),),
        shard=None if shard is None else ShardStamp(shard, epoch),
    )


def test_a_shards_message_is_keyed_by_account_and_shard_and_carries_its_epoch() -> None:
    stamped = update("samples-3", 7, 1, 100)
    assert balance_key(ACCOUNT, stamped.shard) == orjson.dumps([ACCOUNT, "samples-3"])
    assert decode_balance_update(encode_balance_update(stamped)) == stamped
    whole = update(None, 0, 1, 100)
    assert balance_key(ACCOUNT) == ACCOUNT.encode()
    assert "shard" not in orjson.loads(encode_balance_update(whole))["data"]
    assert decode_balance_update(encode_balance_update(whole)) == whole


def test_jobs_lines_and_listed_holds_travel_and_a_whole_ledgers_message_has_neither() -> None:
    lines = used("samples-0", 3, 1, 400, {"job-1": 400, "job-2": 0})
    assert decode_balance_update(encode_balance_update(lines)) == lines
    listed = held(1, {"job-1": 1_000})
    assert decode_balance_update(encode_balance_update(listed)) == listed
    data = orjson.loads(encode_balance_update(budget("global", 1, 1, 10, 0, 0)))["data"]
    assert "holds" not in data["budget"] and "jobs" not in data


# each step: (shard, epoch, seq, GPU-ms) in, then the summed GPU-ms out (None: ignored)
SEQUENCES = {
    "whole-ledger-unchanged": [((None, 0, 1, 100), 100), ((None, 0, 2, 90), 90)],
    "two-shards-summed": [(("samples-0", 1, 1, 100), 100), (("samples-1", 1, 1, 50), 150)],
    "a-shards-newer-message-replaces-its-own": [
        (("samples-0", 1, 1, 100), 100),
        (("samples-1", 1, 1, 50), 150),
        (("samples-0", 1, 2, 130), 180),
    ],
    "stale-epoch-ignored": [
        (("samples-0", 2, 1, 100), 100),
        (("samples-0", 1, 9, 999), None),
        (("samples-1", 1, 1, 50), 150),
    ],
    "newer-epoch-replaces-whatever-its-seq": [
        (("samples-0", 1, 9, 100), 100),
        (("samples-0", 2, 1, 120), 120),
    ],
    "not-newer-in-its-epoch-ignored": [
        (("samples-0", 1, 2, 100), 100),
        (("samples-0", 1, 2, 999), None),
        (("samples-0", 1, 1, 999), None),
    ],
}


def test_an_older_epoch_still_speaks_for_an_account_the_newer_writer_has_not_published() -> None:
    """The topic's partitions interleave accounts: a new writer's message for one account may be
    read before the old writer's last one for another, which the new writer (its refold changed
    nothing there) never republishes; that message is the shard's word on its account."""
    other = "consumer:vision/tracking"
    shards = ShardBalances()
    shards.merge(update("samples-0", 2, 1, 120))  # the new writer, on ACCOUNT
    old = replace(update("samples-0", 1, 7, 40), account=other)
    old = replace(old, periods=(BalanceRow(other, GPU, "2026-11", 40),))
    (merged,) = shards.merge(old)
    assert (merged.account, dict(merged.totals)) == (other, {GPU: 40})
    assert shards.merge(replace(update("samples-0", 1, 8, 999))) == []  # ACCOUNT: epoch 2 kept


@pytest.mark.parametrize("steps", SEQUENCES.values(), ids=SEQUENCES.keys())
def test_the_scheduler_sums_an_account_over_the_shards(
    steps: list[tuple[tuple[str | None, int, int, int], int | None]],
) -> None:
    shards = ShardBalances()
    seqs: list[int] = []
    for (shard, epoch, seq, gpu_ms), expected in steps:
        given = shards.merge(update(shard, epoch, seq, gpu_ms))
        if expected is None:
            assert given == []
            continue
        (merged,) = given  # no budget known: the consumer account alone
        assert merged.shard is None
        assert dict(merged.totals) == {GPU: expected}
        assert merged.periods == (BalanceRow(ACCOUNT, GPU, "2026-11", expected),)
        seqs.append(merged.seq)
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)  # a dispatcher takes each


def budget(shard: str, epoch: int, seq: int, granted: int, consumed: int, held: int):
    line = BudgetLine(Unit.MONEY.value, granted, consumed, held)
    status = BudgetStatus("vision", "2026-11", (line,))
    return BalanceUpdate(
        "budget:vision", seq, T0_US, "2026-11", (), (), status, ShardStamp(shard, epoch)
    )


def used(
    shard: str, epoch: int, seq: int, money: int, jobs: dict[str, int] | None = None
) -> BalanceUpdate:
    """A consumer message of `shard`; `jobs`: its jobs lines (job → money so far)."""
    row = BalanceRow(ACCOUNT, Unit.MONEY.value, "2026-11", money)
    stamp = ShardStamp(shard, epoch)
    lines = tuple(JobAmount(job, row.unit, n) for job, n in (jobs or {}).items())
    return BalanceUpdate(
        ACCOUNT, seq, T0_US, "2026-11", (row,), ((row.unit, money),), None, stamp, lines
    )


def held(seq: int, holds: dict[str, int], baselines: dict[str, int] | None = None) -> BalanceUpdate:
    """The global shard's budget of 10,000 granted, its open holds per job `holds`, each past
    its job's baseline in `baselines` (the usage its earlier holds settled; absent: 0)."""
    listed = tuple(
        JobAmount(job, Unit.MONEY.value, n, (baselines or {}).get(job, 0))
        for job, n in holds.items()
    )
    global_budget = budget("global", 1, seq, 10_000, 0, sum(holds.values()))
    assert global_budget.budget is not None
    return replace(global_budget, budget=replace(global_budget.budget, holds=listed))


# each step: a message in, then the budget's remaining money out (None: no budget given): what
# a whole ledger has after the same events, where usage settles its job's hold as it comes
PROJECTED = {
    "usage-under-the-hold-then-settled": [
        (held(1, {"job-1": 1_000}), 9_000),
        (used("samples-0", 1, 1, 400, {"job-1": 400}), 9_000),  # not 8,600
        (held(2, {}), 9_600),  # ended, settled by the watermark: 600 released
    ],
    "usage-over-the-hold-then-settled": [
        (held(1, {"job-1": 1_000}), 9_000),
        (used("samples-0", 1, 1, 600, {"job-1": 600}), 9_000),
        (used("samples-1", 1, 1, 900, {"job-1": 900}), 8_500),  # 500 over its hold
        (held(2, {}), 8_500),  # settled whole later: no jump up nor down
    ],
    "one-jobs-overrun-frees-nothing-of-anothers": [
        (held(1, {"job-1": 1_000, "job-2": 1_000}), 8_000),
        (used("samples-0", 1, 1, 1_500, {"job-1": 1_500}), 7_500),
    ],
    "a-retry-after-the-first-overran-and-settled": [
        (held(1, {"job-1": 1_000}), 9_000),
        (used("samples-0", 1, 1, 1_500, {"job-1": 1_500}), 8_500),
        (held(2, {}), 8_500),  # settled: the job's baseline moves to 1,500
        (held(3, {"job-1": 800}, {"job-1": 1_500}), 7_700),  # the retry holds 800, none used
        (used("samples-0", 1, 2, 1_800, {"job-1": 1_800}), 7_700),  # it used 300 of it
    ],
    "usage-read-before-the-hold": [
        (used("samples-0", 1, 1, 400, {"job-1": 400}), None),
        (held(1, {"job-1": 1_000}), 9_000),
    ],
    "a-job-left-out-of-a-later-message-keeps-its-line": [
        (held(1, {"job-1": 1_000}), 9_000),
        (used("samples-0", 1, 1, 400, {"job-1": 400}), 9_000),
        (used("samples-0", 1, 2, 450, {"job-2": 50}), 8_950),  # job-2 holds nothing
    ],
    "a-fenced-writers-lines-ignored": [
        (held(1, {"job-1": 1_000}), 9_000),
        (used("samples-0", 2, 1, 400, {"job-1": 400}), 9_000),
        (used("samples-0", 1, 7, 900, {"job-1": 900}), None),
    ],
    "a-moved-shards-new-writer-replaces-the-line": [
        (held(1, {"job-1": 1_000}), 9_000),
        (used("samples-0", 1, 5, 400, {"job-1": 400}), 9_000),
        (used("samples-0", 2, 1, 700, {"job-1": 700}), 9_000),
    ],
}


@pytest.mark.parametrize("steps", PROJECTED.values(), ids=PROJECTED.keys())
def test_a_running_jobs_hold_is_projected_against_its_usage_so_far(
    steps: list[tuple[BalanceUpdate, int | None]],
) -> None:
    shards = ShardBalances()
    for given, remaining in steps:
        budgets = [m.budget for m in shards.merge(given) if m.budget is not None]
        if remaining is None:
            assert budgets == []
            continue
        line = budgets[-1].line(Unit.MONEY.value)
        assert line is not None
        assert line.remaining == remaining


def test_the_dispatchers_budget_is_the_global_shards_with_every_shards_usage(
    tmp_path: Path,
) -> None:
    """The global shard publishes the team's grants, holds and adjustments; each samples shard
    its usage on the team's consumer accounts: the budget consumes both."""
    dispatcher = Rig(tmp_path).dispatcher
    dispatcher.on_balance(used("global", 1, 1, 5))  # an adjustment of the global shard
    dispatcher.on_balance(budget("global", 1, 2, 1_000, 5, 200))  # grants and holds
    dispatcher.on_balance(used("samples-0", 1, 1, 300))  # usage
    dispatcher.on_balance(used("samples-1", 1, 1, 40))
    dispatcher.on_balance(used("samples-0", 0, 5, 900))  # a fenced writer's: ignored
    assert dispatcher.budgets["vision"].lines == (
        BudgetLine(Unit.MONEY.value, 1_000, 5 + 300 + 40, 200),
    )
    balance = dispatcher.balance_of("vision")
    assert balance is not None and balance.money_micros == 1_000 - 345 - 200


@pytest.mark.parametrize("role", [ShardRole.SAMPLES, ShardRole.GLOBAL], ids=str)
def test_a_stamped_shard_publishes_balances_keyed_by_account_and_shard(role: ShardRole) -> None:
    store = MemoryStore()
    stamp = ShardStamp(f"{role}-shard", 4)
    ingest = Ingestor(
        store,
        "c",
        PriceBook((Price("*", 3_600_000),)),
        {},
        topics=OutputTopics("alerts", "dl", "balances"),
        inputs=InputTopics("admin", "jobs", "inventory"),
        role=role,
        shard=stamp,
    )
    adjust = AdjustmentRecorded(ACCOUNT, Unit.MONEY, 5, "2026-11", "alice", "fix", T0_US)
    batch = [message(0, 1, 2)] if role is ShardRole.SAMPLES else [admin_message(0, adjust)]
    ingest.apply(batch)
    sent = [m for m in store.pending_outbox(100) if m.topic == "balances"]
    assert sent
    for m in sent:
        decoded = decode_balance_update(m.value)
        assert decoded.shard == stamp
        assert m.key == orjson.dumps([decoded.account, stamp.shard])
