"""Crash safety: SIGKILL the worker at random moments during a 100,000-sample ingest; after
restarts the ledger holds every sample exactly once and `tally ledger verify` passes."""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import threading
import time

import pytest

from ledger.read.queries import LedgerQueries
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

pytestmark = [pytest.mark.broker, pytest.mark.slow]

KILLS = 5
ROUNDS = 1_563  # × 64 GPUs = 100,032 samples


def test_sigkill_mid_stream_loses_nothing_and_counts_nothing_twice(broker, tmp_path):
    seed = int(os.environ.get("TALLY_CRASH_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    config, path = load(tmp_path, pipeline_config(tmp_path, nodes=4))
    create_topics(broker.bootstrap, list(config.topics.all().values()), 4)
    produced = rounds(fleet_of(config), 0, ROUNDS)
    envelopes = [e for r in produced for e in r]
    assert len(envelopes) >= 100_000
    expected = expected_balances(config, envelopes)
    data_dir = config.ledger.data_dir

    failure: list[BaseException] = []

    def producer() -> None:
        try:
            # ~30 s of steady production, so every kill lands while data is still arriving
            asyncio.run(
                produce(broker.bootstrap, config.topics.samples, produced, pack=4, pause_s=0.075)
            )
        except BaseException as exc:  # surfaced below
            failure.append(exc)

    thread = threading.Thread(target=producer, daemon=True)
    thread.start()
    worker = WorkerProcess(path, broker.bootstrap, tmp_path / "worker.log").start()
    kill_points = []
    try:
        for kill in range(KILLS):
            before = worker.commits()
            wait_until(
                lambda b=before: worker.commits() > b,
                90,
                f"the worker to commit after restart {kill} (seed {seed})",
                worker,
            )
            time.sleep(rng.uniform(0.1, 2.0))
            sealed = sealed_transactions(data_dir)
            assert sealed < len(envelopes), f"kill {kill} came after the ingest ended (seed {seed})"
            kill_points.append(sealed)
            worker.kill()
            worker.start()
        thread.join(120)
        assert not thread.is_alive() and not failure, failure
        wait_until(
            lambda: sealed_transactions(data_dir) == len(envelopes),
            240,
            f"all {len(envelopes)} samples to be sealed (seed {seed})",
            worker,
        )
        time.sleep(1.0)  # anything counted twice would show up in a later seal
        assert LedgerQueries(data_dir).balances() == expected, f"seed {seed}"
    finally:
        worker.stop()
    assert sealed_transactions(data_dir) == len(envelopes)
    result = subprocess.run(
        tally_command("ledger", "verify", "--config", str(path)),
        capture_output=True,
        text=True,
        env=child_env(),
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    print(f"seed {seed}: killed at {kill_points} sealed transactions of {len(envelopes)}")
