"""The alerts-topic consumer: reads alerts and hands them to the dispatcher, committing offsets
only after the dispatcher recorded them (consumer group `tally-alerts` by default).

Messages that are not alerts (`ledger.fleet_alerts.decode_any_alert`) are skipped
(`read_alert`): their offsets are committed, they can never be delivered. Raw GPU health
events (`ledger.events.encode_health`, type `tally.gpu.health`) belong on `inventory-reports`
now (the worker folds them and raises `tally.gpu.health.alert` here); one a collector of an
older build still sends here is skipped quietly (a debug line); anything else (junk, a
malformed alert) is logged as an error. aiokafka's errors are translated here into
`streams.kafka.BrokerError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError

from ledger.errors import EventError
from ledger.events import EventType
from ledger.fleet_alerts import AnyAlert, decode_any_alert
from streams.alerts.dispatcher import AlertDispatcher
from streams.alerts.settings import DEFAULT_GROUP_ID
from streams.kafka import DEFAULT_GROUP_OPTIONS, BrokerError
from streams.progress import ConsumerProgress, observe

log = logging.getLogger("tally.alerts")


def _is_health_event(value: bytes) -> bool:
    """Whether `value` is a GPU health event's envelope (they share the alerts topic)."""
    try:
        doc = orjson.loads(value)
    except orjson.JSONDecodeError:
        return False
    return type(doc) is dict and doc.get("type") == EventType.GPU_HEALTH


def read_alert(value: bytes | None, where: str) -> AnyAlert | None:
    """The alert in one message, or None (logged) for anything else. `where` names the
    message in the log (topic[partition]@offset)."""
    try:
        return decode_any_alert(value or b"")
    except EventError as exc:
        if value and _is_health_event(value):
            log.debug("%s: a GPU health event, not an idle-GPU alert: skipped", where)
        else:
            log.error("%s: %s", where, exc)
        return None


async def consume_alerts(
    bootstrap: tuple[str, ...],
    topic: str,
    dispatcher: AlertDispatcher,
    group_id: str = DEFAULT_GROUP_ID,
    client_id: str = "tally-alerts",
    stop: asyncio.Event | None = None,
    progress: ConsumerProgress | None = None,
    kafka_options: Mapping[str, Any] | None = None,
    group_options: Mapping[str, int] = DEFAULT_GROUP_OPTIONS,
) -> None:
    """Read `topic` and hand alerts to `dispatcher` until `stop` is set; commit offsets after
    `submit` returned. Raises BrokerError when the broker cannot be used. `progress`, when
    given, follows the assignment and lag (health checks). `kafka_options`: the security
    keywords (SASL, TLS); `group_options`: the group timeouts."""
    progress = progress if progress is not None else ConsumerProgress()
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=list(bootstrap),
        group_id=group_id,
        client_id=client_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        **group_options,
        **(kafka_options or {}),
    )
    try:
        await consumer.start()
        while stop is None or not stop.is_set():
            batches = await consumer.getmany(timeout_ms=500, max_records=500)
            alerts: list[AnyAlert] = []
            for partition, messages in batches.items():
                for message in messages:
                    where = f"{partition.topic}[{partition.partition}]@{message.offset}"
                    alert = read_alert(message.value, where)
                    if alert is not None:
                        alerts.append(alert)
            if alerts:
                await asyncio.to_thread(dispatcher.submit, alerts)
            if batches:
                await consumer.commit()
            await observe(consumer, progress)
    except KafkaError as exc:
        progress.failed(exc)
        raise BrokerError(
            "alerts topic {topic} on {bootstrap}: {problem}",
            topic=topic,
            bootstrap=",".join(bootstrap),
            problem=exc,
        ) from exc
    finally:
        with contextlib.suppress(Exception):
            await consumer.stop()
