"""End to end against a real tansu broker: garbage on every topic, and the processes go on.

- The ledger worker (a child process) reads `GARBAGE_PER_TOPIC` Hypothesis-drawn garbage
  messages (fixed seed; `tests.hostile.garbage`: not JSON, NaN, 10,000 levels of nesting,
  wrong shapes, broken envelopes, 1 MiB strings, empty values and tombstones) on each of
  `samples`, `jobs` and `admin`, the samples interleaved with valid ones. Afterwards it is
  alive, the ledger holds exactly the valid samples' balances, every garbage message is its
  dead letters on the `deadletter` topic (counted per source topic), and `tally ledger verify`
  passes.
- The scheduler (`tally scheduler run`, a child process) starts on a `jobs` topic with
  `GARBAGE_PER_TOPIC` garbage messages in it, reads as many on `balances` while it runs,
  schedules a job submitted after them, and after a restart (a replay of the `jobs` topic,
  garbage included) it has the same job.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections import Counter
from typing import Any

import orjson
import pytest
import requests
import yaml
from hypothesis import strategies as st

from ledger.events import encode_envelope
from ledger.inventory import encode_record
from ledger.read.queries import LedgerQueries
from tally.broker import free_port
from tests.conftest import child_env, create_topics, tally_command
from tests.hostile import draw_many, garbage, letters, not_json, wrong_shapes
from tests.integration.support import (
    WorkerProcess,
    expected_balances,
    fleet_of,
    load,
    pipeline_config,
    rounds,
    sealed_transactions,
    wait_until,
)
from tests.integration.test_scheduler_e2e import ADMIN, VISION, SchedulerProcess
from tests.inventory_builders import a_record

pytestmark = [pytest.mark.broker, pytest.mark.slow]

GARBAGE_PER_TOPIC = 200
BIG_PER_TOPIC = 3  # of them over 64 KiB (1 MiB strings): the rest stay small to keep this fast
MIB = 1 << 20


def _garbage(strategy: st.SearchStrategy[bytes], seed: int) -> list[bytes | None]:
    drawn = draw_many(strategy, 3 * GARBAGE_PER_TOPIC, seed)
    big = [v for v in drawn if len(v) > 64 * 1024][:BIG_PER_TOPIC]
    small = [v for v in drawn if len(v) <= 64 * 1024]
    values: list[bytes | None] = [*big, b"", None, *small]
    return values[:GARBAGE_PER_TOPIC]


async def _send(bootstrap: str, topic: str, messages: list[tuple[bytes, bytes | None]]) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", max_request_size=8 * MIB)
    await producer.start()
    try:
        futures = [await producer.send(topic, value, key=key) for key, value in messages]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def _read_all(bootstrap: str, topic: str) -> list[bytes]:
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    out: list[bytes] = []
    try:
        while True:
            batch = await consumer.getmany(timeout_ms=1000)
            if not batch:
                return out
            out += [m.value for msgs in batch.values() for m in msgs]
    finally:
        await consumer.stop()


def test_the_worker_turns_garbage_into_dead_letters_and_books_the_valid_samples(broker, tmp_path):
    config, path = load(tmp_path, pipeline_config(tmp_path, nodes=1))
    topics = config.topics
    create_topics(broker.bootstrap, list(topics.all().values()), 1)
    good = [e for r in rounds(fleet_of(config), 0, 3) for e in r]
    sent: dict[str, list[bytes | None]] = {
        topics.samples: _garbage(garbage("samples"), 1),
        topics.jobs: _garbage(garbage("jobs"), 2),
        topics.admin: _garbage(garbage("admin"), 3),
    }
    # valid samples spread between the garbage, from the first message on
    samples: list[tuple[bytes, bytes | None]] = [(b"garbage", v) for v in sent[topics.samples]]
    for k, envelope in enumerate(good):
        at = k * len(sent[topics.samples]) // len(good) + k
        samples.insert(at, (envelope.subject.encode(), encode_envelope(envelope)))
    asyncio.run(_send(broker.bootstrap, topics.samples, samples))
    for topic in (topics.jobs, topics.admin):
        asyncio.run(_send(broker.bootstrap, topic, [(b"garbage", v) for v in sent[topic]]))
    expected_letters = {topic: sum(letters(v) for v in values) for topic, values in sent.items()}

    worker = WorkerProcess(path, broker.bootstrap, tmp_path / "worker.log").start()
    letters_by_topic: Counter[str] = Counter()
    try:
        wait_until(
            lambda: sealed_transactions(config.ledger.data_dir) == len(good),
            90,
            "the valid samples to be sealed",
            worker,
        )

        def all_letters() -> bool:
            records = asyncio.run(_read_all(broker.bootstrap, topics.deadletter))
            letters_by_topic.clear()
            for record in records:
                assert len(record) <= 64 * 1024
                letter = orjson.loads(record)
                assert letter["reason"]
                letters_by_topic[letter["topic"]] += 1
            return dict(letters_by_topic) == expected_letters

        wait_until(all_letters, 60, "every garbage message to be a dead letter", worker)
        worker.assert_alive()
        assert LedgerQueries(config.ledger.data_dir).balances() == expected_balances(config, good)
    finally:
        assert worker.stop() == 0
    verified = subprocess.run(
        tally_command("ledger", "verify", "--data-dir", str(config.ledger.data_dir)),
        capture_output=True,
        text=True,
        env=child_env(),
        check=False,
    )
    assert verified.returncode == 0, verified.stdout + verified.stderr
    print(  # the closing note's "messages tried per boundary"
        "hostile e2e: garbage messages sent "
        + ", ".join(f"{t}={len(v)}" for t, v in sent.items())
        + f"; valid samples {len(good)}; dead letters {dict(letters_by_topic)}"
    )


def test_the_scheduler_replays_a_jobs_topic_with_garbage_and_ignores_balances_garbage(
    broker, tmp_path
):
    port = free_port()
    api = f"http://127.0.0.1:{port}"
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(yaml.safe_dump({"admin": ADMIN, "teams": {"vision": VISION}}))
    data = pipeline_config(tmp_path, nodes=1, partitions=1)
    data["quotas"] = [{"team": "vision", "pool": "a100", "model": "A100", "nominal": 4}]
    data["queues"] = [{"name": "dev", "class": "dev"}]
    data["scheduler"] = {
        "port": port,
        "cycle_interval_s": 0.2,
        "work_dir": str(tmp_path / "scheduler"),
        "tokens": {"file": str(tokens), "admin_env": None},
    }
    data["inventory"] = {"stale_after_intervals": 86_400}
    config, path = load(tmp_path, data)
    topics = config.topics
    create_topics(broker.bootstrap, list(topics.all().values()), 1)
    now = time.time_ns() // 1000
    reported = [  # what a worker would have published for a collector's node: 4 fresh A100s
        a_record(
            f"GPU-a100-{i}", node="a100-node-00", index=i, model="A100", pool="a100",
            interval_us=1_000_000, first_seen_us=now, last_seen_us=now,
        )
        for i in range(4)
    ]  # fmt: skip
    asyncio.run(
        _send(
            broker.bootstrap,
            topics.inventory,
            [(g.uuid.encode(), encode_record(g)) for g in reported],
        )
    )
    jobs_garbage = _garbage(garbage("jobs"), 4)
    balance_garbage = _garbage(st.one_of(not_json(), wrong_shapes()), 5)
    asyncio.run(_send(broker.bootstrap, topics.jobs, [(b"g", v) for v in jobs_garbage]))

    scheduler = SchedulerProcess(path, broker.bootstrap, tmp_path / "scheduler.log", api)
    scheduler.start()
    try:
        asyncio.run(_send(broker.bootstrap, topics.balances, [(b"g", v) for v in balance_garbage]))
        submitted = subprocess.run(
            tally_command(
                "job", "submit", "--api", api, "--token", VISION, "-q", "dev", "-p", "detection",
                "--gpus", "1", "--estimate", "1h", "--", "true",
            ),
            capture_output=True, text=True, env=child_env(), check=False,
        )  # fmt: skip
        assert submitted.returncode == 0, submitted.stderr
        job = submitted.stdout.strip()

        def job_state() -> dict[str, Any]:
            return dict(scheduler.get(f"/v1/jobs/{job}")["job"])

        wait_until(lambda: job_state()["state"] == "finished", 60, "the job to run and finish")
        # every balances message but the tombstone is refused with its reason, one by one
        refusals = sum(1 for v in balance_garbage if v is not None)
        wait_until(
            lambda: (
                scheduler.log.read_text(errors="replace").count("ignored a balances message")
                == refusals
            ),
            30,
            "the scheduler to refuse every balances message",
        )
        record = job_state()
        assert scheduler.stop() == 0
        scheduler.start()  # replays the jobs topic: the garbage, then the job's events
        assert job_state() == record
        health = requests.get(f"{api}/v1/health", timeout=5)
        assert health.status_code == 200
    finally:
        code = scheduler.stop()
    log = (tmp_path / "scheduler.log").read_text(errors="replace")
    assert code == 0, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
    print(
        f"hostile e2e: scheduler garbage sent {topics.jobs}={len(jobs_garbage)}, "
        f"{topics.balances}={len(balance_garbage)}; {json.dumps(record['state'])} after replay"
    )
