"""End to end against a real tansu broker: `tally worker` in a child process seals onto a volume
that fills up (a size-capped tmpfs, `tests.capped_volume`; the kernel refuses the writes with
ENOSPC). Sealing stops with one clear error in the log and in the metrics, the worker stays up
and keeps committing into its hot database, readers keep seeing exactly what was sealed before,
and once space returns sealing resumes by itself: the sealed totals are exact and
`tally ledger verify` passes."""

from __future__ import annotations

import asyncio
import subprocess

import pytest

from ledger.read.queries import LedgerQueries
from tests.capped_volume import capped_volume, put_on
from tests.conftest import child_env, create_topics, tally_command
from tests.integration.support import (
    expected_balances,
    fleet_of,
    load,
    pipeline_config,
    produce,
    rounds,
    sealed_transactions,
    wait_until,
)
from tests.integration.test_metrics_e2e import MetricsWorker, scrape, value

pytestmark = pytest.mark.broker

VOLUME_BYTES = 4 << 20


def test_a_full_segments_volume_blocks_sealing_until_space_returns(broker, tmp_path):
    config, path = load(tmp_path, pipeline_config(tmp_path, nodes=1, partitions=2))
    topics = config.topics
    create_topics(broker.bootstrap, list(topics.all().values()), 2)
    data_dir = config.ledger.data_dir
    produced = rounds(fleet_of(config), 0, 30)
    first = [e for r in produced[:10] for e in r]
    everything = [e for r in produced for e in r]

    with capped_volume(tmp_path / "volume", VOLUME_BYTES) as volume:
        put_on(volume, data_dir, "segments", "archive")
        worker = MetricsWorker(path, broker.bootstrap, tmp_path / "worker.log").start()
        try:
            url = worker.url()
            asyncio.run(produce(broker.bootstrap, topics.samples, produced[:10]))
            wait_until(
                lambda: sealed_transactions(data_dir) == len(first), 90, "round 1 sealed", worker
            )
            sealed_before = LedgerQueries(data_dir).balances()

            volume.fill()
            asyncio.run(produce(broker.bootstrap, topics.samples, produced[10:]))
            wait_until(
                lambda: value(scrape(url), "tally_worker_batch_messages_sum") == len(everything),
                90,
                "round 2 committed into the hot database",
                worker,
            )
            wait_until(
                lambda: (value(scrape(url), "tally_worker_seal_failures_total") or 0) >= 2,
                30,
                "sealing to fail, and fail again on retry",
                worker,
            )
            blocked = scrape(url)
            assert value(blocked, "tally_worker_sealing_blocked") == 1
            log = worker.log.read_text(errors="replace")
            stopped = [line for line in log.splitlines() if "sealing stopped: " in line]
            assert len(stopped) == 1, stopped  # one clear error, not one per retry
            assert ".parquet: No space left on device" in stopped[0]
            # readers see exactly the earlier seal, nothing half-written
            assert LedgerQueries(data_dir).balances() == sealed_before
            assert sealed_transactions(data_dir) == len(first)

            volume.release()
            wait_until(
                lambda: sealed_transactions(data_dir) == len(everything),
                60,
                "sealing to resume once space returned",
                worker,
            )
            wait_until(
                lambda: value(scrape(url), "tally_worker_sealing_blocked") == 0,
                30,
                "the blocked gauge to clear",
                worker,
            )
            assert "sealing resumed after" in worker.log.read_text(errors="replace")
            assert LedgerQueries(data_dir).balances() == expected_balances(config, everything)
            result = subprocess.run(
                tally_command("ledger", "verify", "--config", str(path)),
                capture_output=True,
                text=True,
                env=child_env(),
                check=False,
            )
        finally:
            assert worker.stop() == 0
        assert result.returncode == 0, result.stdout + result.stderr
        assert "ledger OK" in result.stdout
