"""What the simulated cluster's collector knows of the scheduler: which job holds each GPU now.

`JobsView` folds `jobs`-topic messages (`GpuAssigned` / `GpuReleased`, and `JobSubmitted` for
the job's queue) into the fleet's `jobs` map (GPU UUID → the job's workload: its queue's
profile, owned by its team, project, user and job), so the simulated fleet meters what the
scheduler placed. A GPU's assignment changes share its key and so its partition, in order; a
submission may arrive after its job's assignments (another partition): the job's GPUs then
take the queue's profile when it does. Everything else on the topic is passed over.
`follow_jobs` reads the topic from the start with no consumer group until stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any

from collectors.simulated import SimulatedFleet, WorkloadKind
from collectors.workload import kind_of_queue
from ledger.events import Owner
from ledger.job_events import GpuAssigned, GpuReleased, JobSubmitted
from ledger.jobs_message import decode_jobs_message

log = logging.getLogger("tally.collector")


class JobsView:
    def __init__(self, fleet: SimulatedFleet) -> None:
        self.fleet = fleet
        self.assigned: dict[str, GpuAssigned] = {}
        self.queues: dict[str, str] = {}

    def apply(self, value: bytes | None) -> None:
        message = decode_jobs_message(value)
        for envelope in message.audited:
            event = envelope.data
            if isinstance(event, JobSubmitted):
                self.queues[event.spec.job_id] = event.spec.queue
                for a in self.assigned.values():
                    if a.job_id == event.spec.job_id:
                        self._place(a)
        for envelope in message.assignments:
            event = envelope.data
            if isinstance(event, GpuAssigned):
                self.assigned[event.gpu_uuid] = event
                self._place(event)
            elif isinstance(event, GpuReleased):
                self.assigned.pop(event.gpu_uuid, None)
                self.fleet.jobs.pop(event.gpu_uuid, None)

    def _place(self, a: GpuAssigned) -> None:
        kind = WorkloadKind(kind_of_queue(self.queues.get(a.job_id, "")).value)
        owner = Owner(team=a.team, project=a.project, user=a.user, job_id=a.job_id)
        self.fleet.jobs[a.gpu_uuid] = self.fleet.job_workload(kind, owner)


async def follow_jobs(
    view: JobsView,
    servers: str,
    topic: str,
    kafka_options: Mapping[str, Any],
    stop: asyncio.Event,
) -> None:
    """Apply every message of `topic` to `view`, from the start, until `stop` is set."""
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=servers,
        group_id=None,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        **kafka_options,
    )
    await consumer.start()
    try:
        while not stop.is_set():
            batches = await consumer.getmany(timeout_ms=500, max_records=5_000)
            for records in batches.values():
                for record in records:
                    view.apply(record.value)
    except Exception as exc:  # the collector goes on metering what it knows
        log.warning("following %s stopped: %s: %s", topic, type(exc).__name__, exc)
    finally:
        with contextlib.suppress(Exception):
            await consumer.stop()
