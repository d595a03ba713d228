"""End to end against a real tansu broker: simulated fleet → producer → worker (a real child
process running the Faust app) → DuckDB → sealed Parquet → `ledger.read.queries`."""

from __future__ import annotations

import asyncio
import subprocess
import time

import orjson
import pytest

from ledger.read.queries import LedgerQueries
from tally.broker import EmbeddedBroker
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


def _verify(config_path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        tally_command("ledger", "verify", "--config", str(config_path)),
        capture_output=True,
        text=True,
        env=child_env(),
        check=False,
    )


def test_simulated_fleet_to_sealed_ledger_totals_are_exact(broker, tmp_path):
    config, path = load(tmp_path, pipeline_config(tmp_path))
    create_topics(broker.bootstrap, list(config.topics.all().values()), 4)
    fleet = fleet_of(config)
    produced = rounds(fleet, 0, 60)  # 60 rounds × 32 GPUs = 1,920 samples
    envelopes = [e for r in produced for e in r]
    # send every round, then the first ten again: a collector's resend must not count twice
    asyncio.run(produce(broker.bootstrap, config.topics.samples, produced + produced[:10], pack=7))

    worker = WorkerProcess(path, broker.bootstrap, tmp_path / "worker.log").start()
    try:
        data_dir = config.ledger.data_dir
        wait_until(
            lambda: sealed_transactions(data_dir) == len(envelopes),
            90,
            "every sample to be sealed",
            worker,
        )
        assert LedgerQueries(data_dir).balances() == expected_balances(config, envelopes)
    finally:
        assert worker.stop() == 0
    result = _verify(path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ledger OK" in result.stdout
    report = subprocess.run(
        tally_command("report", "cost", "--by", "team", "--config", str(path), "-o", "csv"),
        capture_output=True,
        text=True,
        env=child_env(),
        check=True,
    )
    teams = {line.split(",")[0] for line in report.stdout.splitlines()[1:]}
    assert teams <= {"vision", "language", "search"} and teams


def test_malformed_messages_go_to_the_dead_letter_topic(broker, tmp_path):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    config, path = load(tmp_path, pipeline_config(tmp_path, nodes=1))
    create_topics(broker.bootstrap, list(config.topics.all().values()), 1)
    good = rounds(fleet_of(config), 0, 2)

    async def send_garbage() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap)
        await producer.start()
        try:
            await producer.send_and_wait(config.topics.samples, b"{this is not json")
            await producer.send_and_wait(config.topics.samples, b'{"type": "tally.gpu.sample"}')
        finally:
            await producer.stop()

    asyncio.run(produce(broker.bootstrap, config.topics.samples, good[:1]))
    asyncio.run(send_garbage())
    asyncio.run(produce(broker.bootstrap, config.topics.samples, good[1:]))
    worker = WorkerProcess(path, broker.bootstrap, tmp_path / "worker.log").start()
    try:
        wait_until(
            lambda: sealed_transactions(config.ledger.data_dir) == 32,
            90,
            "the good samples to be sealed",
            worker,
        )

        async def dead_letters() -> list[bytes]:
            consumer = AIOKafkaConsumer(
                config.topics.deadletter,
                bootstrap_servers=broker.bootstrap,
                auto_offset_reset="earliest",
            )
            await consumer.start()
            try:
                batch = await consumer.getmany(timeout_ms=5000)
                return [m.value for msgs in batch.values() for m in msgs]
            finally:
                await consumer.stop()

        letters = asyncio.run(dead_letters())
    finally:
        assert worker.stop() == 0
    assert len(letters) == 2
    assert b"not JSON" in letters[0]
    assert b'"offset":1' in letters[0]
    assert _verify(path).returncode == 0


def test_a_restarted_embedded_broker_is_a_new_incarnation(tmp_path):
    """tansu keeps nothing across restarts: offsets start at 0 again and must not be skipped."""
    config, path = load(tmp_path, pipeline_config(tmp_path, nodes=1))
    fleet = fleet_of(config)
    first, second = rounds(fleet, 0, 5), rounds(fleet, 5, 5)
    data_dir = config.ledger.data_dir
    port = None
    for batch, total in ((first, 80), (second, 160)):
        with EmbeddedBroker(port=port) as broker:
            port = broker.port  # the same address, as after `make up` is restarted
            create_topics(broker.bootstrap, list(config.topics.all().values()), 2)
            asyncio.run(produce(broker.bootstrap, config.topics.samples, batch))
            worker = WorkerProcess(path, broker.bootstrap, tmp_path / "worker.log").start()
            try:
                wait_until(
                    lambda n=total: sealed_transactions(data_dir) == n,
                    90,
                    f"{total} sealed samples",
                    worker,
                )
            finally:
                assert worker.stop() == 0
    everything = [e for r in first + second for e in r]
    assert LedgerQueries(data_dir).balances() == expected_balances(config, everything)
    incarnations = {s.incarnation for s in LedgerQueries(data_dir).segments()}
    assert len(incarnations) == 2
    assert _verify(path).returncode == 0


def test_an_idle_notebook_raises_exactly_one_alert_and_its_resolve(broker, tmp_path):
    from aiokafka import AIOKafkaConsumer

    from collectors.producer import SampleProducer
    from ledger.events import envelope_for
    from tests.builders import T0_US, a_process, a_sample, an_owner

    data = pipeline_config(tmp_path, nodes=1)
    data["idle"] = {"min_duration_min": 30, "resolve_duration_min": 5}
    config, path = load(tmp_path, data)
    create_topics(broker.bootstrap, list(config.topics.all().values()), 2)
    notebook = an_owner("vision", "detection", "ada", "nb-7")
    minute = 60_000_000
    utils = [0] * 40 + [85] * 10  # idle 40 minutes, then busy
    samples = [
        a_sample(
            model="H100",
            pool="h100",
            sample_time_us=T0_US + (m + 1) * minute,
            interval_us=minute,
            util_gpu_pct=u,
            processes=(a_process(sm=u, owner=notebook),),
        )
        for m, u in enumerate(utils)
    ]

    async def send() -> None:
        producer = SampleProducer(broker.bootstrap, config.topics.samples)
        await producer.start()
        try:
            for sample in samples:  # one message per sample, the real-time shape
                producer.add([envelope_for(sample, "nvml://node-01")])
                await producer.flush()
        finally:
            await producer.stop()

    async def alerts() -> list[dict]:
        consumer = AIOKafkaConsumer(
            config.topics.alerts, bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest"
        )
        await consumer.start()
        try:
            batch = await consumer.getmany(timeout_ms=5000)
            return [orjson.loads(m.value) for msgs in batch.values() for m in msgs]
        finally:
            await consumer.stop()

    asyncio.run(send())
    worker = WorkerProcess(path, broker.bootstrap, tmp_path / "worker.log").start()
    try:
        wait_until(
            lambda: sealed_transactions(config.ledger.data_dir) == len(samples),
            90,
            "the notebook's samples to be sealed",
            worker,
        )
        wait_until(lambda: len(asyncio.run(alerts())) >= 2, 30, "two alerts", worker)
        time.sleep(1)
        received = asyncio.run(alerts())
    finally:
        assert worker.stop() == 0
    assert [a["type"] for a in received] == ["tally.idle.detected", "tally.idle.resolved"]
    assert {a["data"]["owner"]["job"] for a in received} == {"nb-7"}
    assert received[0]["data"]["since_us"] == T0_US
