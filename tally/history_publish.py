"""`tally up`'s backfill of a new ledger: the configuration's admin state (teams, prices,
quotas, budgets) effective from the start of the history, then the simulated cluster's history
(`tally.history`): its jobs-topic messages with their `tally-seq`, then its sample rounds,
packed as the collector packs a backfill. Runs before the scheduler and the collector start,
so the scheduler rebuilds its state from a topic that already holds the history, and each
GPU's history samples precede its live ones (the ledger deduplicates per GPU, in time order).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from collectors.producer import SampleProducer
from collectors.runner import source_name
from ledger.admin import AdminView, admin_envelope, encode_admin, plan_admin
from ledger.events import envelope_for
from scheduler.kafka import KafkaPublisher
from tally.components import desired_admin_state
from tally.config import TallyConfig
from tally.history import history_fleet, history_samples, simulate_history
from tally.scheduling import service_settings

US_PER_DAY = 86_400 * 1_000_000
JOBS_CHUNK = 2_000
ACTOR = "tally-up"


@dataclass(frozen=True, slots=True)
class Backfilled:
    days: int
    jobs: int
    job_messages: int
    samples: int
    admin_events: int
    seconds: float


async def backfill_history(
    config: TallyConfig,
    servers: tuple[str, ...],
    kafka_options: Mapping[str, Any],
    now_us: int,
) -> Backfilled:
    """Publish the admin state and `fleet.workload.history_days` of history ending at
    `now_us` (see the module docstring)."""
    from aiokafka import AIOKafkaProducer

    started = time.monotonic()
    workload = config.fleet.workload
    days = workload.history_days if workload is not None else 0
    start_us = now_us - days * US_PER_DAY
    plan = plan_admin(
        desired_admin_state(config), AdminView(), ACTOR, "the simulated cluster", start_us
    )
    admin = AIOKafkaProducer(
        bootstrap_servers=",".join(servers), acks="all", request_timeout_ms=10_000, **kafka_options
    )
    await admin.start()
    try:
        for event in plan.events:
            key, value = encode_admin(admin_envelope(event))
            await admin.send_and_wait(config.topics.admin, value, key=key)
    finally:
        await admin.stop()
    if days == 0:
        return Backfilled(0, 0, 0, 0, len(plan.events), time.monotonic() - started)

    history = simulate_history(config, start_us, now_us)
    publisher = KafkaPublisher(service_settings(config, servers, kafka_options))
    await publisher.start()
    try:
        for i in range(0, len(history.messages), JOBS_CHUNK):
            await publisher.publish(history.messages[i : i + JOBS_CHUNK])
    finally:
        await publisher.stop()

    producer = SampleProducer(
        ",".join(servers),
        config.topics.samples,
        client_id=config.broker.client_id,
        kafka_options=kafka_options,
    )
    await producer.start()
    samples = 0
    packed = 0
    try:
        fleet = history_fleet(config)
        sources = {gpu.node: source_name(gpu.node) for gpu in fleet.gpus}
        for round_ in history_samples(fleet, history):
            producer.add(envelope_for(s, sources[s.node]) for s in round_)
            samples += len(round_)
            packed += 1
            if packed >= config.fleet.pack_rounds:
                await producer.flush()
                packed = 0
        await producer.flush()
    finally:
        await producer.stop()
    return Backfilled(
        days,
        history.planned,
        len(history.messages),
        samples,
        len(plan.events),
        time.monotonic() - started,
    )
