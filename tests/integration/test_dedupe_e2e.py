"""Exactly once without a window, end to end against a real tansu broker and a real worker child
process: samples a collector resends after the dedupe window forgot their ids are refused as
`too late to deduplicate` (dead letters, never booked twice), and `tally report refused` shows
them."""

from __future__ import annotations

import asyncio
import subprocess
import time

import orjson
import pytest

from ledger.read.queries import LedgerQueries
from ledger.store.layout import SEGMENTS_DIR
from ledger.store.side_files import load_refused
from tests.conftest import child_env, create_topics, tally_command
from tests.integration.support import (
    WorkerProcess,
    expected_balances,
    fleet_of,
    load,
    pipeline_config,
    produce,
    rounds,
    sealed_transactions,
    wait_until,
)

pytestmark = pytest.mark.broker

DAY_ROUNDS = 86_400 // 10  # the simulated fleet samples every 10 s


def test_a_resend_after_the_window_is_refused_and_reported(broker, tmp_path):
    config, path = load(tmp_path, pipeline_config(tmp_path, nodes=1, dedupe_window_days=1))
    create_topics(broker.bootstrap, list(config.topics.all().values()), 1)
    fleet = fleet_of(config)
    first, later = rounds(fleet, 0, 1), rounds(fleet, 3 * DAY_ROUNDS, 1)  # day 0, then day 3
    booked = first[0] + later[0]
    asyncio.run(produce(broker.bootstrap, config.topics.samples, first + later))
    worker = WorkerProcess(path, broker.bootstrap, tmp_path / "worker.log").start()
    data_dir = config.ledger.data_dir
    try:
        wait_until(
            lambda: sealed_transactions(data_dir) == len(booked), 60, "both rounds sealed", worker
        )
        time.sleep(2 * config.ledger.seal_interval_s + 0.5)  # a seal prunes right after it
        asyncio.run(produce(broker.bootstrap, config.topics.samples, first))  # day 0 again

        def refused() -> int:
            groups = load_refused(data_dir / SEGMENTS_DIR)
            return sum(g.letters for g in groups if g.reason == "too late to deduplicate")

        wait_until(lambda: refused() == len(first[0]), 30, "the resend refused", worker)
        assert LedgerQueries(data_dir).balances() == expected_balances(config, booked)
        assert sealed_transactions(data_dir) == len(booked)
    finally:
        assert worker.stop() == 0
    report = subprocess.run(
        tally_command("report", "refused", "--config", str(path), "-o", "json"),
        capture_output=True,
        text=True,
        env=child_env(),
        check=True,
    )
    rows = orjson.loads(report.stdout)
    assert [(r["reason"], r["topic"], r["letters"]) for r in rows] == [
        ("too late to deduplicate", config.topics.samples, len(first[0]))
    ]
