"""The budget and idle-time watch inside `tally alerts run`: budget burn from the `balances`
topic and each team's allocated-but-idle GPU time per day from the idle-GPU alerts, published
as alerts on the alerts topic (where delivery picks them up like any other).

Why here: the `balances` topic already carries every team's budget in the current period after
each ledger commit (`ledger.balances`), and the alerts topic every idle episode with its owner,
so neither needs the ledger's writer; the decisions are the pure functions of
`ledger.alert_rules`. `AlertWatch` is the state between them (plain values in, alerts out);
`run_watch` is its Kafka adapter.

Restart: `run_watch` reads both topics from the start without a consumer group. Until it
reaches the end offsets it had at start it only remembers — the latest budget of each team, the
idle spans, and the alerts it published before (thresholds fired, forecasts open, team-days
raised) — then evaluates each team's latest budget once and goes live. So a restart neither
repeats an alert still on the topic nor misses one; an alert raised again after the topic
forgot it has the same id, and delivery drops it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, tzinfo

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError

from ledger.alert_rules import (
    BudgetMemory,
    BudgetRules,
    IdleSpan,
    TeamIdleMemory,
    budget_step,
    forget_before,
    idle_days,
    team_idle_step,
    track_idle,
)
from ledger.alerts import Alert
from ledger.balances import BudgetStatus, decode_balance_update
from ledger.errors import EventError
from ledger.fleet_alerts import (
    AnyAlert,
    BudgetAlert,
    FleetAlert,
    FleetKind,
    TeamIdleAlert,
    alert_key,
    decode_any_alert,
    encode_fleet_alert,
)
from ledger.shard_balances import ShardBalances
from streams.kafka import BrokerError

log = logging.getLogger("tally.alerts")


@dataclass(frozen=True, slots=True)
class WatchRules:
    """`budget`: None turns budget alerts off; `team_idle_gpu_ms`: the daily allocated-but-idle
    GPU time over which a team is reported (None: off), days of the ledger's time zone `zone`."""

    budget: BudgetRules | None = field(default_factory=BudgetRules)
    team_idle_gpu_ms: int | None = None
    zone: tzinfo = UTC

    @property
    def enabled(self) -> bool:
        return self.budget is not None or self.team_idle_gpu_ms is not None


class AlertWatch:
    """Budgets and idle spans in, alerts out. Not thread-safe."""

    def __init__(self, rules: WatchRules) -> None:
        self.rules = rules
        self.budget_memory = BudgetMemory()
        self.idle_memory = TeamIdleMemory()
        self.budgets: dict[str, tuple[BudgetStatus, int]] = {}  # team → (status, as of)
        self.shard_balances = ShardBalances()  # a sharded ledger's, summed over its shards
        self.spans: dict[tuple[str, int], IdleSpan] = {}
        self.now_us = 0  # the latest time the topics told (event time, not the wall clock)

    def on_balance(self, status: BudgetStatus, as_of_us: int, live: bool) -> list[FleetAlert]:
        """A team's budget; when `live`, the alerts it raises (else only remembered)."""
        self.now_us = max(self.now_us, as_of_us)
        self.budgets[status.team] = (status, as_of_us)
        if not live or self.rules.budget is None:
            return []
        self.budget_memory, raised = budget_step(
            self.budget_memory, status, as_of_us, self.rules.budget
        )
        return list(raised)

    def catch_up(self) -> list[FleetAlert]:
        """After the replay: what the latest budget of each team raises now."""
        out: list[FleetAlert] = []
        for status, as_of in list(self.budgets.values()):
            out += self.on_balance(status, as_of, live=True)
        return out + list(self.idle_check())

    def on_alert(self, alert: AnyAlert) -> None:
        """An alert on the topic: idle episodes feed the spans; our own alerts, the memory."""
        self.now_us = max(self.now_us, alert.at_us)
        if isinstance(alert, Alert):
            self.spans = track_idle(self.spans, alert)
        elif isinstance(alert, BudgetAlert):
            memory = self.budget_memory
            key = (alert.team, alert.period, alert.unit)
            if alert.kind is FleetKind.BUDGET_THRESHOLD and alert.threshold_pct is not None:
                fired = memory.fired | {(*key, alert.threshold_pct)}
                self.budget_memory = BudgetMemory(fired, memory.forecasting)
            elif alert.kind is FleetKind.BUDGET_FORECAST:
                self.budget_memory = BudgetMemory(memory.fired, memory.forecasting | {key})
            else:
                self.budget_memory = BudgetMemory(memory.fired, memory.forecasting - {key})
        elif isinstance(alert, TeamIdleAlert):
            days = self.idle_memory.fired | {(alert.team, alert.day_start_us)}
            self.idle_memory = TeamIdleMemory(days)

    def idle_check(self) -> list[TeamIdleAlert]:
        """Teams over the daily idle threshold today or yesterday, not yet reported."""
        threshold = self.rules.team_idle_gpu_ms
        if threshold is None or not self.now_us:
            return []
        zone = self.rules.zone
        self.idle_memory, raised = team_idle_step(
            self.idle_memory, self.spans.values(), self.now_us, threshold, zone
        )
        (yesterday, _), _ = idle_days(self.now_us, zone)
        self.spans = forget_before(self.spans, yesterday)
        return raised


def _read_alert(value: bytes | None) -> AnyAlert | None:
    try:
        return decode_any_alert(value or b"")
    except EventError:
        return None  # health events, junk: the delivery consumer logs what matters


async def run_watch(
    bootstrap: tuple[str, ...],
    balances_topic: str,
    alerts_topic: str,
    watch: AlertWatch,
    stop: asyncio.Event,
    client_id: str = "tally-alerts-watch",
) -> None:
    """Feed `watch` from both topics (from the start, no group) and publish what it raises on
    `alerts_topic` until `stop` is set. Raises BrokerError when the broker cannot be used."""
    servers = list(bootstrap)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=servers,
        client_id=client_id,
        enable_auto_commit=False,
        group_id=None,
        auto_offset_reset="earliest",
    )
    producer = AIOKafkaProducer(bootstrap_servers=servers, client_id=client_id, acks="all")
    try:
        await consumer.start()
        await producer.start()
        await consumer.topics()  # fetches the cluster's metadata: partitions_for_topic needs it
        parts = [
            TopicPartition(topic, p)
            for topic in (balances_topic, alerts_topic)
            for p in sorted(consumer.partitions_for_topic(topic) or ())
        ]
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        ends = await consumer.end_offsets(parts)
        live = not any(ends.values())
        if live:
            await _publish(producer, alerts_topic, watch.catch_up())
        while not stop.is_set():
            batches = await consumer.getmany(timeout_ms=500, max_records=1000)
            raised: list[FleetAlert] = []
            for tp, messages in batches.items():
                for message in messages:
                    if tp.topic == alerts_topic:
                        alert = _read_alert(message.value)
                        if alert is not None:
                            watch.on_alert(alert)
                        continue
                    raised += _on_balance(watch, message.value, live)
            if not live and all(
                await asyncio.gather(*(_reached(consumer, tp, end) for tp, end in ends.items()))
            ):
                live = True
                raised += watch.catch_up()
            elif live:
                raised += watch.idle_check()
            await _publish(producer, alerts_topic, raised)
    except KafkaError as exc:
        raise BrokerError(
            "alert watch on {bootstrap}: {problem}", bootstrap=",".join(bootstrap), problem=exc
        ) from exc
    finally:
        with contextlib.suppress(Exception):
            await consumer.stop()
        with contextlib.suppress(Exception):
            await producer.stop()


async def _reached(consumer: AIOKafkaConsumer, tp: TopicPartition, end: int) -> bool:
    return end == 0 or await consumer.position(tp) >= end


def _on_balance(watch: AlertWatch, value: bytes | None, live: bool) -> list[FleetAlert]:
    try:
        update = decode_balance_update(value or b"")
    except EventError:
        return []
    raised: list[FleetAlert] = []
    for merged in watch.shard_balances.merge(update):  # as it is, unless a shard's
        if merged.budget is not None:
            raised += watch.on_balance(merged.budget, merged.as_of_us, live)
    return raised


async def _publish(producer: AIOKafkaProducer, topic: str, alerts: Iterable[FleetAlert]) -> None:
    sent = [await producer.send(topic, encode_fleet_alert(a), key=alert_key(a)) for a in alerts]
    if sent:
        await asyncio.gather(*sent)
        log.info("raised %d alert(s) on %s", len(sent), topic)
