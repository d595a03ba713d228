"""The alerts-topic consumer: reads alerts and hands them to the dispatcher, committing offsets
only after the dispatcher recorded them (consumer group `tally-alerts` by default).

Messages that are not idle-GPU alerts (junk, or the GPU health events that share the topic) are
logged and skipped: their offsets are committed, they can never be delivered. aiokafka's errors
are translated here into `streams.kafka.BrokerError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError

from ledger.alerts import Alert, decode_alert
from ledger.errors import EventError
from streams.alerts.dispatcher import AlertDispatcher
from streams.alerts.settings import DEFAULT_GROUP_ID
from streams.kafka import BrokerError

log = logging.getLogger("tally.alerts")


async def consume_alerts(
    bootstrap: tuple[str, ...],
    topic: str,
    dispatcher: AlertDispatcher,
    group_id: str = DEFAULT_GROUP_ID,
    client_id: str = "tally-alerts",
    stop: asyncio.Event | None = None,
) -> None:
    """Read `topic` and hand alerts to `dispatcher` until `stop` is set; commit offsets after
    `submit` returned. Raises BrokerError when the broker cannot be used."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=list(bootstrap),
        group_id=group_id,
        client_id=client_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    try:
        await consumer.start()
        while stop is None or not stop.is_set():
            batches = await consumer.getmany(timeout_ms=500, max_records=500)
            alerts: list[Alert] = []
            for partition, messages in batches.items():
                for message in messages:
                    try:
                        alerts.append(decode_alert(message.value or b""))
                    except EventError as exc:
                        log.error(
                            "%s[%d]@%d: %s",
                            partition.topic,
                            partition.partition,
                            message.offset,
                            exc,
                        )
            if alerts:
                await asyncio.to_thread(dispatcher.submit, alerts)
            if batches:
                await consumer.commit()
    except KafkaError as exc:
        raise BrokerError(f"alerts topic {topic} on {','.join(bootstrap)}: {exc}") from exc
    finally:
        with contextlib.suppress(Exception):
            await consumer.stop()
