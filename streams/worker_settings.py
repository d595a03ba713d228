"""The worker's settings and what it reports: `WorkerSettings` (one worker's configuration,
made by `tally.components.worker_settings`), the group timeouts as Faust takes them, the
observer the metrics implement, the counters it keeps and the sealing health it logs from.
Kept apart from `streams.worker` (which re-exports them) so the worker's module holds its
behaviour only."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, tzinfo
from pathlib import Path
from typing import Any, Protocol

from ledger.idle import IdlePolicy
from ledger.pricing import PriceBook
from ledger.store.hot_memory import DEFAULT_MEMORY_LIMIT
from ledger.store.objects import ObjectStore
from ledger.store.replica import DEFAULT_GRACE_S, Publisher
from streams.kafka import DEFAULT_GROUP_OPTIONS

DEFAULT_IDLE_POLICY = IdlePolicy()


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    bootstrap: tuple[str, ...]
    group_id: str
    samples_topic: str
    deadletter_topic: str
    alerts_topic: str
    data_dir: Path
    prices: PriceBook
    cost_centres: Mapping[str, str]
    batch_max_messages: int = 2000
    batch_within_s: float = 0.25
    seal_interval_s: float = 5.0
    compact_below_rows: int = 500_000
    compact_min_segments: int = 8
    dedupe_window_us: int = 7 * 86_400_000_000
    kafka_options: Mapping[str, Any] = field(default_factory=dict)  # security: SASL, TLS
    group_options: Mapping[str, int] = field(default_factory=lambda: DEFAULT_GROUP_OPTIONS)
    faust_credentials: Any = None  # the same security as Faust's `broker_credentials`
    idle_policy: IdlePolicy = DEFAULT_IDLE_POLICY
    admin_topic: str = "tally.admin"  # read by Faust agents (the samples topic is not:
    jobs_topic: str = "tally.jobs"  # `streams.sample_batches`)
    balances_topic: str | None = None  # and balances are not published
    inventory_reports_topic: str = "tally.inventory-reports"  # a Faust agent too
    inventory_topic: str | None = None  # None: inventory records are not published
    zone: tzinfo = UTC  # ledger.timezone: recorded in a new ledger, checked in an existing one
    publisher: Publisher | None = None  # the sealed ledger's object store (None: data_dir)
    duckdb_memory_limit: int | None = DEFAULT_MEMORY_LIMIT  # bytes (`ledger.store.hot_memory`)
    # `ledger.sharded`: one shard per samples partition (`streams.shards`), published under
    # `shards/<name>/` of `segments_store` (required then); `publisher` is unused
    sharded: bool = False
    segments_store: ObjectStore | None = None
    grace_s: float = DEFAULT_GRACE_S  # the shards' publishers' (`ledger.object_store.grace_s`)


def faust_group_options(group: Mapping[str, int]) -> dict[str, Any]:
    """The group timeouts (aiokafka keywords, ms) as `faust.App` settings (seconds)."""
    options: dict[str, Any] = {
        "broker_session_timeout": group["session_timeout_ms"] / 1000,
        "broker_heartbeat_interval": group["heartbeat_interval_ms"] / 1000,
        "broker_rebalance_timeout": group["rebalance_timeout_ms"] / 1000,
    }
    if "request_timeout_ms" in group:
        options["broker_request_timeout"] = group["request_timeout_ms"] / 1000
    return options


class WorkerObserver(Protocol):
    """What the worker reports as it goes (the metrics implement it). An observer that fails
    is logged and otherwise ignored: it never stops the ledger."""

    def observe_batch(self, messages: int, postings: int, commit_seconds: float) -> None: ...

    def dead_letter(self, count: int = 1) -> None: ...

    def worker_error(self, kind: str) -> None: ...

    def undeliverable(self, topic: str, count: int = 1) -> None: ...

    def seal_failed(self) -> None: ...

    def sealing_blocked(self, blocked: bool) -> None: ...


@dataclass(slots=True)
class WorkerStats:
    batches: int = 0
    messages: int = 0
    samples: int = 0
    duplicates: int = 0
    dead_letters: int = 0
    alerts: int = 0
    admin_events: int = 0
    hold_events: int = 0
    balances_published: int = 0
    undeliverable: int = 0
    segments_sealed: int = 0
    seal_failures: int = 0
    last_commit_ms: float = 0.0


@dataclass(slots=True)
class SealingHealth:
    """Whether sealing is blocked, by what, and for how many tries: what to log, decided from
    the outcome of each seal (values in, values out)."""

    blocked_by: str | None = None
    failures: int = 0

    def failed(self, reason: str) -> bool:
        """Record a failed seal; True when it should be logged (the first, or a new reason:
        `reason` names what blocks sealing, not the file a try was writing)."""
        new = reason != self.blocked_by
        self.blocked_by = reason
        self.failures += 1
        return new

    def succeeded(self) -> int:
        """Record a seal that worked; the failures it ends (0: sealing was not blocked)."""
        ended = self.failures
        self.blocked_by, self.failures = None, 0
        return ended
