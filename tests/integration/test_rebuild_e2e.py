"""End to end against a real tansu broker: simulated fleet, admin events and holds → worker (a
real child process) → sealed ledger and raw-event archive → `tally ledger rebuild` replays the
archive (and the topics, while the broker still holds them) into a fresh ledger: identical."""

from __future__ import annotations

import asyncio
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from ledger.admin import (
    AdjustmentRecorded,
    BudgetGranted,
    PeriodClosed,
    admin_envelope,
    encode_admin,
)
from ledger.holds import HoldPlaced, HoldReleased, encode_hold, hold_envelope
from ledger.store.rebuild import archive_batch_count
from ledger.units import Unit
from tests.builders import T0_US
from tests.conftest import child_env, create_topics, tally_command
from tests.integration.support import (
    WorkerProcess,
    fleet_of,
    load,
    pipeline_config,
    produce,
    rounds,
    send_messages,
    wait_until,
)

pytestmark = pytest.mark.broker
HOUR_US = 3_600_000_000
META = ("alice", "e2e", T0_US + HOUR_US)


def _consumed(log: Path) -> int:
    """Messages the worker's log says it committed."""
    return sum(int(n) for n in re.findall(r"batch committed: (\d+) messages", log.read_text()))


def _settled(data_dir: Path, log: Path, quiet_s: float = 3.0) -> Callable[[], bool]:
    """True once every message the worker committed is archived and sealed, and nothing new
    came for `quiet_s`."""
    seen: dict[str, float] = {}

    def check() -> bool:
        archived = archive_batch_count(data_dir)[1]
        consumed = _consumed(log)
        key = f"{archived}/{consumed}"
        first = seen.setdefault(key, time.monotonic())
        return archived == consumed > 0 and time.monotonic() - first >= quiet_s

    return check


def _rebuild(path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        tally_command("ledger", "rebuild", "--config", str(path), "-o", "json", *args),
        capture_output=True,
        text=True,
        env=child_env(),
        check=False,
        timeout=180,
    )


def test_the_ledger_rebuilt_from_its_archive_and_from_the_topics_equals_the_live_one(
    broker, tmp_path
):
    config, path = load(tmp_path, pipeline_config(tmp_path, nodes=1, partitions=2))
    topics = config.topics
    create_topics(broker.bootstrap, list(topics.all().values()), 2)
    fleet = fleet_of(config)
    first, second = rounds(fleet, 0, 20), rounds(fleet, 20, 20)
    grants = [
        BudgetGranted("vision", "2026-11", Unit.MONEY, 500_000_000, *META),
        BudgetGranted("language", "2026-11", Unit.GPU_MS, 90_000_000, *META),
        AdjustmentRecorded("consumer:vision/detection", Unit.MONEY, -1_000, "2026-11", *META),
    ]
    holds = [
        HoldPlaced("job-e2e", "vision", "detection", Unit.GPU_MS, 60_000, T0_US + HOUR_US, T0_US),
        HoldReleased("job-e2e", T0_US + 100_000_000, "completed"),
    ]

    async def feed() -> None:
        await send_messages(
            broker.bootstrap, topics.admin, [encode_admin(admin_envelope(g)) for g in grants]
        )
        await produce(broker.bootstrap, topics.samples, first, pack=3)
        await send_messages(
            broker.bootstrap, topics.jobs, [encode_hold(hold_envelope(h)) for h in holds]
        )
        await produce(broker.bootstrap, topics.samples, second + first[:4], pack=5)  # resends
        close = PeriodClosed("2026-10", "alice", "nothing ran in October", T0_US + HOUR_US)
        await send_messages(broker.bootstrap, topics.admin, [encode_admin(admin_envelope(close))])

    asyncio.run(feed())
    data_dir, log = config.ledger.data_dir, tmp_path / "worker.log"
    worker = WorkerProcess(path, broker.bootstrap, log).start()
    try:
        wait_until(_settled(data_dir, log), 120, "every message to be archived and sealed", worker)
    finally:
        assert worker.stop() == 0
    held = _consumed(log)
    assert held >= 3 + 2 + 2 * 20  # admin, holds, and the samples of at least 40 rounds

    verify = subprocess.run(
        tally_command("ledger", "verify", "--config", str(path), "-o", "json"),
        capture_output=True,
        text=True,
        env=child_env(),
        check=False,
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr
    checked = orjson.loads(verify.stdout)
    assert checked["archived_messages"] == held and checked["closed_periods"] == 1

    from_archive = _rebuild(path)
    assert from_archive.returncode == 0, from_archive.stdout + from_archive.stderr
    report = orjson.loads(from_archive.stdout)
    assert report["identical"] and report["messages"] == held
    assert report["batches"] >= 3  # admin, samples and jobs were folded in batches of their own

    from_topics = _rebuild(path, "--from", "topics", "--bootstrap", broker.bootstrap)
    assert from_topics.returncode == 0, from_topics.stdout + from_topics.stderr
    assert orjson.loads(from_topics.stdout)["identical"]
