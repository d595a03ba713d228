"""End to end against a real tansu broker: simulated fleet samples, `tally admin apply` with
budgets and a hold on the jobs topic → the worker (a child process) → the compacted `balances`
topic carries, per account, the balances of the sealed ledger's fold, and for `budget:<team>`
the team's remaining budget."""

from __future__ import annotations

import asyncio
import subprocess
from collections import defaultdict

import pytest

from ledger.holds import HoldPlaced, encode_hold, hold_envelope
from ledger.read.balances import sealed_balances
from ledger.units import Unit
from streams.kafka import ensure_topics
from tests.builders import T0_US
from tests.conftest import child_env, tally_command
from tests.integration.support import (
    WorkerProcess,
    fleet_of,
    latest_balances,
    load,
    pipeline_config,
    produce,
    rounds,
    sealed_transactions,
    send_messages,
    wait_until,
)

pytestmark = pytest.mark.broker

VISION_GPU_MS = 36_000_000  # 10 GPU-hours
SEARCH_MONEY = 250_000_000  # 250.00
HOLD_GPU_MS = 1_000_000


def test_balances_topic_carries_the_ledgers_balances_and_remaining_budgets(broker, tmp_path):
    data = pipeline_config(tmp_path, nodes=1, partitions=2)
    data["budgets"] = [
        {"team": "vision", "period": "2026-11", "gpu_hours": 10},
        {"team": "search", "period": "2026-11", "money": "250.00"},
    ]
    config, path = load(tmp_path, data)
    topics = config.topics
    asyncio.run(ensure_topics(broker.bootstrap, list(topics.all().values()), 2, [topics.balances]))
    samples = rounds(fleet_of(config), 0, 20)  # 20 rounds × 16 GPUs
    asyncio.run(produce(broker.bootstrap, topics.samples, samples[:10], pack=5))
    applied = subprocess.run(
        tally_command("admin", "apply", str(path), "--initial", "--bootstrap", broker.bootstrap),
        capture_output=True,
        text=True,
        env=child_env(),
        check=False,
    )
    assert applied.returncode == 0, applied.stderr
    hold = HoldPlaced("nb-9", "vision", "detection", Unit.GPU_MS, HOLD_GPU_MS, T0_US * 2, T0_US)
    asyncio.run(send_messages(broker.bootstrap, topics.jobs, [encode_hold(hold_envelope(hold))]))

    worker = WorkerProcess(path, broker.bootstrap, tmp_path / "worker.log").start()
    # the rest arrives while the worker runs: usage after the grant re-publishes the budget
    asyncio.run(produce(broker.bootstrap, topics.samples, samples[10:], pause_s=0.2))
    data_dir = config.ledger.data_dir
    expected_transactions = 20 * 16 + 2 + 1  # usage, two grants, one hold
    try:
        wait_until(
            lambda: sealed_transactions(data_dir) == expected_transactions,
            90,
            "every sample, grant and hold to be sealed",
            worker,
        )
        folded = sealed_balances(data_dir)
        by_account: dict[str, dict[tuple[str, str], int]] = defaultdict(dict)
        for row in folded:
            by_account[row.account][(row.period, row.unit)] = row.balance

        def published_matches() -> bool:
            latest = latest_balances(broker.bootstrap, topics.balances, timeout_ms=1000)
            return set(latest) == set(by_account) and all(
                {(r.period, r.unit): r.balance for r in update.periods} == by_account[account]
                for account, update in latest.items()
            )

        wait_until(published_matches, 30, "the balances topic to match the ledger", worker)
        latest = latest_balances(broker.bootstrap, topics.balances)
    finally:
        assert worker.stop() == 0

    def november(prefix: str, unit: str) -> int:  # the first round began in October
        return sum(
            r.balance
            for r in folded
            if r.account.startswith(prefix) and r.unit == unit and r.period == "2026-11"
        )

    consumed = november("consumer:vision/", "gpu_ms")
    assert consumed > 0
    vision = latest["budget:vision"].budget
    assert vision is not None and vision.period == "2026-11"
    (line,) = vision.lines
    assert (line.unit, line.granted, line.consumed, line.open_holds) == (
        "gpu_ms",
        VISION_GPU_MS,
        consumed,
        HOLD_GPU_MS,
    )
    assert line.remaining == VISION_GPU_MS - consumed - HOLD_GPU_MS
    search = latest["budget:search"].budget
    assert search is not None
    (money,) = search.lines
    assert (money.unit, money.granted, money.open_holds) == ("money_micros", SEARCH_MONEY, 0)
    assert money.remaining == SEARCH_MONEY - november("consumer:search/", "money_micros")
    assert latest["hold:vision"].totals == (("gpu_ms", HOLD_GPU_MS),)
    verify = subprocess.run(
        tally_command("ledger", "verify", "--config", str(path)),
        capture_output=True,
        text=True,
        env=child_env(),
        check=False,
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr
