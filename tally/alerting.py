"""Alert delivery: idle-GPU alerts from the alerts topic to webhooks (Slack, Alertmanager).

This module owns the sink machinery behind `tally alerts`: the sink configuration, the payload
formats, the per-sink delivery queues, the delivery log that deduplicates across restarts, and
the consumer loop that feeds them from the alerts topic (consumer group `tally-alerts`).

Guarantees:
- **At least once per sink, deduplicated by alert id.** An alert's id is content-derived
  (`ledger.idle.IdleAlert.id`), so a redelivered message is the same alert. Before the topic
  offset is committed, each sink's copy is recorded `queued` in the delivery log
  (`<data_dir>/alerts/deliveries.jsonl`, appended and fsynced); a sink's copy is recorded
  `sent` after a 2xx answer, or `dropped` with the reason. On start, copies still `queued` are
  queued again; ids the log knows are never queued twice for the same sink.
- **A webhook that is down never blocks the stream or the other sinks.** Each sink has its own
  bounded queue and delivery thread; the consumer only appends to the log and puts without
  waiting. A full queue drops the alert for that sink (recorded, logged and counted as
  `queue_full`), never silently.
- **Retries with exponential backoff.** Timeouts, connection errors, 408, 429 and 5xx are retried
  after `backoff_initial_s`, doubling up to `backoff_max_s`, for at most `max_attempts` tries,
  then dropped as `gave_up`; other 4xx answers are dropped at once as `rejected` (resending the
  same payload cannot succeed). Every failed try is counted and logged; a sink whose latest try
  failed is reported down (`SinkWorker.up`, the `tally_alert_sink_up` metric).
- **Resolve notifications.** `IdleGpuResolved` is delivered like any alert. Slack receives a
  "resolved" message; Alertmanager receives the same labels with `endsAt` set. Firing alerts are
  re-posted to Alertmanager every `resend_interval_s` (with `endsAt` four intervals ahead, as
  Prometheus does) so they do not expire while the GPU stays idle.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from decimal import ROUND_HALF_EVEN, Decimal
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Protocol

import orjson
import requests
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    model_validator,
)

from ledger.idle import AlertKind
from ledger.units import MICROS_PER_UNIT, MS_PER_HOUR

if TYPE_CHECKING:
    from tally.config import TallyConfig

log = logging.getLogger("tally.alerts")

DEFAULT_GROUP_ID = "tally-alerts"
LOG_DIR = "alerts"
LOG_NAME = "deliveries.jsonl"
ALERTMANAGER_PATH = "/api/v2/alerts"
ALERT_NAME = "TallyGpuAllocatedIdle"
TEST_SUBJECT = "tally-test"
RETRIED_STATUS = frozenset({408, 425, 429})
KEEP_DELIVERED_US = 30 * 86_400_000_000  # delivery records older than this are compacted away


# ------------------------------------------------------------------------------ configuration


class SinkKind(StrEnum):
    SLACK = "slack"
    ALERTMANAGER = "alertmanager"


_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")  # as `tally.config.NAME`


def _name(value: Any) -> str:
    if not isinstance(value, str) or not _NAME.match(value):
        raise ValueError(
            "names use letters, digits, '.', '_' and '-', start with a letter or digit, "
            "and are at most 64 characters"
        )
    return value


Name = Annotated[str, BeforeValidator(_name)]


def _url(value: Any) -> str:
    if not isinstance(value, str) or not value.startswith(("http://", "https://")):
        raise ValueError("expected an http:// or https:// URL")
    return value


class AlertSinkConfig(BaseModel):
    """One webhook. `url` is the Slack (or compatible) incoming-webhook URL, or Alertmanager's
    base URL (`http://host:9093`; Tally posts to `/api/v2/alerts` under it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Name
    kind: SinkKind
    url: Annotated[str, BeforeValidator(_url)]
    timeout_s: float = Field(5.0, gt=0, le=120)
    max_attempts: int = Field(8, ge=1, le=1000)
    backoff_initial_s: float = Field(1.0, gt=0, le=3600)
    backoff_max_s: float = Field(60.0, gt=0, le=3600)
    queue_size: int = Field(1000, ge=1, le=1_000_000)
    headers: dict[str, str] = Field(default_factory=dict)
    resend_interval_s: float = Field(60.0, ge=0, le=86_400)
    dashboard_url: str | None = None

    @property
    def endpoint(self) -> str:
        if self.kind is SinkKind.ALERTMANAGER and not self.url.rstrip("/").endswith(
            ALERTMANAGER_PATH
        ):
            return self.url.rstrip("/") + ALERTMANAGER_PATH
        return self.url


class AlertsConfig(BaseModel):
    """The `alerts:` section: where idle-GPU alerts go."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sinks: tuple[AlertSinkConfig, ...] = ()
    group_id: Name = DEFAULT_GROUP_ID

    @model_validator(mode="after")
    def _unique_names(self) -> AlertsConfig:
        names = [s.name for s in self.sinks]
        if len(set(names)) != len(names):
            raise ValueError("alert sink names must be unique")
        return self


def load_alerts_config(path: Path | str) -> tuple[TallyConfig, AlertsConfig]:
    """The Tally configuration and its `alerts:` section; ConfigError names file and field."""
    from tally.config import load_config

    config = load_config(path)
    return config, config.alerts


# ------------------------------------------------------------------------------ alerts


@dataclass(frozen=True, slots=True)
class Alert:
    """An idle-GPU alert as published on the alerts topic (`ledger.idle.encode_alert`)."""

    id: str
    kind: AlertKind
    subject: str
    gpu_uuid: str
    node: str
    pool: str
    model: str
    team: str | None
    project: str | None
    user: str | None
    job: str | None
    since_us: int
    at_us: int
    waste_gpu_ms: int
    waste_micros: int
    reason: str | None = None

    @property
    def resolved(self) -> bool:
        return self.kind is AlertKind.RESOLVED

    @property
    def episode(self) -> tuple[str, int]:
        """Detected and resolved alerts of one idle episode share this."""
        return self.subject, self.since_us


def decode_alert(value: bytes | str) -> Alert:
    """An alert from its envelope; ValueError (with the reason) for anything else."""
    try:
        doc = orjson.loads(value)
        data = doc["data"]
        owner = data.get("owner") or {}
        return Alert(
            id=str(doc["id"]),
            kind=AlertKind(doc["type"]),
            subject=str(doc["subject"]),
            gpu_uuid=str(data["gpu_uuid"]),
            node=str(data["node"]),
            pool=str(data["pool"]),
            model=str(data["model"]),
            team=owner.get("team"),
            project=owner.get("project"),
            user=owner.get("user"),
            job=owner.get("job"),
            since_us=int(data["since_us"]),
            at_us=int(data["at_us"]),
            waste_gpu_ms=int(data["waste_gpu_ms"]),
            waste_micros=int(data["waste_micros"]),
            reason=data.get("reason"),
        )
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"not an idle-GPU alert: {exc!r}") from exc


def alert_to_dict(alert: Alert) -> dict[str, Any]:
    return {
        "id": alert.id,
        "type": alert.kind.value,
        "subject": alert.subject,
        "data": {
            "gpu_uuid": alert.gpu_uuid,
            "node": alert.node,
            "pool": alert.pool,
            "model": alert.model,
            "owner": {
                "team": alert.team,
                "project": alert.project,
                "user": alert.user,
                "job": alert.job,
            },
            "since_us": alert.since_us,
            "at_us": alert.at_us,
            "waste_gpu_ms": alert.waste_gpu_ms,
            "waste_micros": alert.waste_micros,
            "reason": alert.reason,
        },
    }


def sample_alert(now_us: int | None = None) -> Alert:
    """A recognisable alert for `tally alerts test` (its id is unique per call)."""
    now = now_us if now_us is not None else time.time_ns() // 1_000
    return Alert(
        id=f"tally-test-{now}",
        kind=AlertKind.DETECTED,
        subject=TEST_SUBJECT,
        gpu_uuid="GPU-TEST",
        node="test-node",
        pool="test-pool",
        model="Test GPU",
        team="test-team",
        project="test-project",
        user="test-user",
        job="test-job",
        since_us=now - 30 * 60_000_000,
        at_us=now,
        waste_gpu_ms=30 * 60_000,
        waste_micros=1_500_000,
    )


# ------------------------------------------------------------------------------ payloads


def _iso(time_us: int) -> str:
    moment = datetime.fromtimestamp(time_us // 1_000_000, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _when(time_us: int) -> str:
    return datetime.fromtimestamp(time_us // 1_000_000, tz=UTC).strftime("%Y-%m-%d %H:%M UTC")


def _money(micros: int, currency: str) -> str:
    value = (Decimal(micros) / MICROS_PER_UNIT).quantize(Decimal("0.01"), ROUND_HALF_EVEN)
    return f"{value:,.2f} {currency}"


def _hours(gpu_ms: int) -> str:
    return f"{Decimal(gpu_ms) / MS_PER_HOUR:.2f}"


def _owner(alert: Alert) -> str:
    who = "/".join(p for p in (alert.team, alert.project) if p) or "unknown owner"
    extra = ", ".join(
        part
        for part in (alert.user and f"user {alert.user}", alert.job and f"job {alert.job}")
        if part
    )
    return f"{who} ({extra})" if extra else who


def _reason(reason: str | None) -> str:
    return {
        "busy_again": "it is busy again",
        "owner_changed": "it changed owner",
        "released": "its owner released it",
    }.get(reason or "", "it is no longer idle")


def summary(alert: Alert, currency: str) -> str:
    """One line a person understands, for both kinds."""
    gpu = f"GPU {alert.gpu_uuid} on {alert.node} ({alert.pool}, {alert.model})"
    waste = f"{_money(alert.waste_micros, currency)} for {_hours(alert.waste_gpu_ms)} GPU-hours"
    if alert.resolved:
        return (
            f"Resolved: {gpu} held by {_owner(alert)} is no longer idle: {_reason(alert.reason)} "
            f"({_when(alert.at_us)}). Idle since {_when(alert.since_us)}; waste {waste}."
        )
    return (
        f"{gpu} is allocated but idle since {_when(alert.since_us)}, held by {_owner(alert)}. "
        f"Waste so far: {waste}."
    )


def slack_payload(alert: Alert, currency: str, dashboard_url: str | None = None) -> dict[str, Any]:
    """A Slack incoming-webhook message (`text` for notifications, `blocks` for the layout)."""
    icon = ":white_check_mark:" if alert.resolved else ":warning:"
    text = f"{icon} {summary(alert, currency)}"
    fields = [
        ("GPU", f"`{alert.gpu_uuid}`"),
        ("Node", alert.node),
        ("Pool / model", f"{alert.pool} / {alert.model}"),
        ("Owner", _owner(alert)),
        ("Idle since", _when(alert.since_us)),
        ("Waste", _money(alert.waste_micros, currency)),
    ]
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": {"type": "mrkdwn", "text": text}},
        {
            "type": "section",
            "fields": [{"type": "mrkdwn", "text": f"*{k}*\n{v}"} for k, v in fields],
        },
    ]
    context = f"Tally idle-GPU alert `{alert.id}`"
    if dashboard_url:
        context += f" · <{dashboard_url}|open the dashboard>"
    blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": context}]})
    return {"text": text, "blocks": blocks}


def alertmanager_labels(alert: Alert) -> dict[str, str]:
    """The alert's identity in Alertmanager: the same for its detection and its resolution."""
    labels = {
        "alertname": ALERT_NAME,
        "severity": "warning",
        "source": "tally",
        "subject": alert.subject,
        "gpu_uuid": alert.gpu_uuid,
        "node": alert.node,
        "pool": alert.pool,
        "model": alert.model,
        "team": alert.team,
        "project": alert.project,
        "user": alert.user,
        "job": alert.job,
    }
    return {k: v for k, v in labels.items() if v}


def alertmanager_payload(
    alerts: Iterable[Alert],
    currency: str,
    dashboard_url: str | None = None,
    firing_ends_us: int | None = None,
) -> list[dict[str, Any]]:
    """The body of `POST /api/v2/alerts`. Resolved alerts carry `endsAt` (their resolve
    time); firing ones carry `firing_ends_us` when given (their expiry unless re-sent)."""
    out = []
    for alert in alerts:
        item: dict[str, Any] = {
            "labels": alertmanager_labels(alert),
            "annotations": {
                "summary": summary(alert, currency),
                "idle_since": _iso(alert.since_us),
                "waste": _money(alert.waste_micros, currency),
                "waste_gpu_hours": _hours(alert.waste_gpu_ms),
                "alert_id": alert.id,
            },
            "startsAt": _iso(alert.since_us),
        }
        if alert.resolved:
            item["endsAt"] = _iso(alert.at_us)
        elif firing_ends_us is not None:
            item["endsAt"] = _iso(firing_ends_us)
        if dashboard_url:
            item["generatorURL"] = dashboard_url
        out.append(item)
    return out


# ------------------------------------------------------------------------------ delivery log


class DeliveryState(StrEnum):
    QUEUED = "queued"
    SENT = "sent"
    DROPPED = "dropped"


class DropReason(StrEnum):
    QUEUE_FULL = "queue_full"
    GAVE_UP = "gave_up"
    REJECTED = "rejected"


@dataclass(frozen=True, slots=True)
class Delivery:
    sink: str
    alert: Alert
    state: DeliveryState
    reason: str | None = None


class DeliveryLog:
    """What was queued, sent and dropped per sink and alert id: an append-only JSON-lines file.

    Each line is one state change; the latest line of a (sink, id) wins. A torn last line (a
    crash mid-write) is ignored. On open the file is rewritten with one line per (sink, id),
    leaving out finished deliveries older than `KEEP_DELIVERED_US` (by alert time) unless
    their episode is still open.
    """

    def __init__(self, data_dir: Path | str, now_us: int | None = None) -> None:
        self.path = Path(data_dir) / LOG_DIR / LOG_NAME
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, str], Delivery] = {}
        self._load()
        self._compact(now_us if now_us is not None else time.time_ns() // 1_000)
        self._handle = self.path.open("ab")

    def _load(self) -> None:
        try:
            lines = self.path.read_bytes().splitlines()
        except FileNotFoundError:
            return
        for line in lines:
            try:
                doc = orjson.loads(line)
                alert = decode_alert(orjson.dumps(doc["alert"]))
                entry = Delivery(
                    str(doc["sink"]), alert, DeliveryState(doc["state"]), doc.get("reason")
                )
            except (orjson.JSONDecodeError, KeyError, ValueError, TypeError):
                log.warning("%s: skipping an unreadable line", self.path)
                continue
            self._entries[(entry.sink, alert.id)] = entry

    def _compact(self, now_us: int) -> None:
        open_episodes = {
            (d.sink, d.alert.episode) for d in self._entries.values() if not d.alert.resolved
        } - {(d.sink, d.alert.episode) for d in self._entries.values() if d.alert.resolved}
        keep = {
            key: d
            for key, d in self._entries.items()
            if d.state is DeliveryState.QUEUED
            or now_us - d.alert.at_us < KEEP_DELIVERED_US
            or (d.sink, d.alert.episode) in open_episodes
        }
        self._entries = keep
        tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        with tmp.open("wb") as handle:
            for d in keep.values():
                handle.write(_line(d))
            handle.flush()
            os.fsync(handle.fileno())
        tmp.replace(self.path)

    def known(self, sink: str, alert_id: str) -> bool:
        with self._lock:
            return (sink, alert_id) in self._entries

    def record(self, entries: Iterable[Delivery]) -> None:
        """Append state changes and make them durable (one fsync per call)."""
        with self._lock:
            wrote = False
            for d in entries:
                self._entries[(d.sink, d.alert.id)] = d
                self._handle.write(_line(d))
                wrote = True
            if wrote:
                self._handle.flush()
                os.fsync(self._handle.fileno())

    def pending(self, sink: str) -> list[Alert]:
        """Alerts queued for `sink` and neither sent nor dropped, oldest first."""
        with self._lock:
            found = [
                d.alert
                for d in self._entries.values()
                if d.sink == sink and d.state is DeliveryState.QUEUED
            ]
        return sorted(found, key=lambda a: (a.at_us, a.id))

    def firing(self, sink: str) -> list[Alert]:
        """Detections sent to `sink` whose resolution has not been sent."""
        with self._lock:
            sent = [
                d.alert
                for d in self._entries.values()
                if d.sink == sink and d.state is DeliveryState.SENT
            ]
        resolved = {a.episode for a in sent if a.resolved}
        return [a for a in sent if not a.resolved and a.episode not in resolved]

    def state(self, sink: str, alert_id: str) -> Delivery | None:
        with self._lock:
            return self._entries.get((sink, alert_id))

    def close(self) -> None:
        with self._lock:
            self._handle.close()


def _line(d: Delivery) -> bytes:
    doc = {
        "sink": d.sink,
        "state": d.state.value,
        "reason": d.reason,
        "alert": alert_to_dict(d.alert),
    }
    return orjson.dumps(doc) + b"\n"


# ------------------------------------------------------------------------------ sinks


class DeliveryMetrics(Protocol):
    """What the delivery machinery reports (`tally.metrics.TallyMetrics` implements it)."""

    def alert_delivered(self, sink: str, kind: str) -> None: ...
    def alert_failed(self, sink: str) -> None: ...
    def alert_dropped(self, sink: str, reason: str) -> None: ...
    def alert_queue(self, sink: str, length: int) -> None: ...
    def alert_sink_up(self, sink: str, up: bool) -> None: ...


class NoMetrics:
    def alert_delivered(self, sink: str, kind: str) -> None:
        pass

    def alert_failed(self, sink: str) -> None:
        pass

    def alert_dropped(self, sink: str, reason: str) -> None:
        pass

    def alert_queue(self, sink: str, length: int) -> None:
        pass

    def alert_sink_up(self, sink: str, up: bool) -> None:
        pass


@dataclass(frozen=True, slots=True)
class Attempt:
    """The outcome of one POST: `ok`, or whether trying again could help, and why."""

    ok: bool
    retry: bool
    detail: str
    status: int | None = None
    seconds: float = 0.0


def post_json(
    session: requests.Session, url: str, body: Any, timeout_s: float, headers: Mapping[str, str]
) -> Attempt:
    started = time.monotonic()
    try:
        response = session.post(
            url,
            data=orjson.dumps(body),
            headers={"Content-Type": "application/json", **headers},
            timeout=timeout_s,
        )
    except requests.Timeout:
        return Attempt(False, True, f"no answer within {timeout_s:g}s", None, timeout_s)
    except requests.RequestException as exc:
        return Attempt(False, True, f"{type(exc).__name__}: {exc}", None)
    seconds = time.monotonic() - started
    status = response.status_code
    if 200 <= status < 300:
        return Attempt(True, False, f"HTTP {status}", status, seconds)
    retry = status >= 500 or status in RETRIED_STATUS
    body_text = response.text[:200].strip()
    return Attempt(False, retry, f"HTTP {status}: {body_text}", status, seconds)


def payload_for(
    config: AlertSinkConfig, alerts: list[Alert], currency: str, now_us: int | None = None
) -> Any:
    if config.kind is SinkKind.SLACK:
        assert len(alerts) == 1
        return slack_payload(alerts[0], currency, config.dashboard_url)
    ends = None
    if config.resend_interval_s > 0:
        now = now_us if now_us is not None else time.time_ns() // 1_000
        ends = now + int(4 * config.resend_interval_s * 1_000_000)
    return alertmanager_payload(alerts, currency, config.dashboard_url, ends)


class SinkWorker:
    """One webhook: a bounded queue and a thread that delivers from it, one alert at a time."""

    def __init__(
        self,
        config: AlertSinkConfig,
        delivery_log: DeliveryLog,
        currency: str,
        metrics: DeliveryMetrics,
        session: requests.Session | None = None,
    ) -> None:
        self.config = config
        self.log = delivery_log
        self.currency = currency
        self.metrics = metrics
        self.session = session or requests.Session()
        self.queue: queue.Queue[Alert] = queue.Queue(maxsize=config.queue_size)
        self.up = True
        self.consecutive_failures = 0
        self.last_error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"alerts-{config.name}", daemon=True)
        self._last_resend = time.monotonic()

    @property
    def name(self) -> str:
        return self.config.name

    def start(self) -> SinkWorker:
        for alert in self.log.pending(self.name):  # queued before a restart
            if not self.offer(alert):
                break
        self._thread.start()
        return self

    def offer(self, alert: Alert) -> bool:
        """Queue `alert` without waiting; on a full queue drop it (recorded, logged, counted)."""
        try:
            self.queue.put_nowait(alert)
        except queue.Full:
            self.log.record([Delivery(self.name, alert, DeliveryState.DROPPED, "queue_full")])
            self.metrics.alert_dropped(self.name, DropReason.QUEUE_FULL)
            log.error(
                "alert sink %s: queue full (%d), dropped alert %s (%s)",
                self.name,
                self.config.queue_size,
                alert.id,
                alert.kind.value,
            )
            return False
        self.metrics.alert_queue(self.name, self.queue.qsize())
        return True

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                alert = self.queue.get(timeout=0.2)
            except queue.Empty:
                self._maybe_resend()
                continue
            try:
                self._deliver(alert)
            finally:
                self.queue.task_done()
                self.metrics.alert_queue(self.name, self.queue.qsize())

    def _deliver(self, alert: Alert) -> None:
        delay = self.config.backoff_initial_s
        for attempt in range(1, self.config.max_attempts + 1):
            outcome = post_json(
                self.session,
                self.config.endpoint,
                payload_for(self.config, [alert], self.currency),
                self.config.timeout_s,
                self.config.headers,
            )
            self._note(outcome)
            if outcome.ok:
                self.log.record([Delivery(self.name, alert, DeliveryState.SENT)])
                self.metrics.alert_delivered(self.name, alert.kind.value)
                return
            log.warning(
                "alert sink %s: try %d/%d of alert %s failed: %s",
                self.name,
                attempt,
                self.config.max_attempts,
                alert.id,
                outcome.detail,
            )
            if not outcome.retry:
                self._drop(alert, DropReason.REJECTED, outcome.detail)
                return
            if attempt == self.config.max_attempts:
                break
            if self._stop.wait(delay):
                return  # stopping: the alert stays queued in the log for the next start
            delay = min(delay * 2, self.config.backoff_max_s)
        self._drop(alert, DropReason.GAVE_UP, self.last_error or "")

    def _drop(self, alert: Alert, reason: DropReason, detail: str) -> None:
        self.log.record([Delivery(self.name, alert, DeliveryState.DROPPED, reason.value)])
        self.metrics.alert_dropped(self.name, reason)
        log.error(
            "alert sink %s: dropped alert %s (%s) — %s: %s",
            self.name,
            alert.id,
            alert.kind.value,
            reason.value,
            detail,
        )

    def _note(self, outcome: Attempt) -> None:
        if outcome.ok:
            self.consecutive_failures = 0
            self.last_error = None
            self.up = True
        else:
            self.consecutive_failures += 1
            self.last_error = outcome.detail
            self.up = False
            self.metrics.alert_failed(self.name)
        self.metrics.alert_sink_up(self.name, self.up)

    def _maybe_resend(self) -> None:
        interval = self.config.resend_interval_s
        if self.config.kind is not SinkKind.ALERTMANAGER or interval <= 0:
            return
        if time.monotonic() - self._last_resend < interval:
            return
        self._last_resend = time.monotonic()
        firing = self.log.firing(self.name)
        if not firing:
            return
        outcome = post_json(
            self.session,
            self.config.endpoint,
            payload_for(self.config, firing, self.currency),
            self.config.timeout_s,
            self.config.headers,
        )
        self._note(outcome)
        if not outcome.ok:
            log.warning(
                "alert sink %s: re-sending firing alerts failed: %s", self.name, outcome.detail
            )

    def idle(self) -> bool:
        return self.queue.unfinished_tasks == 0

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)


class AlertDispatcher:
    """Fans alerts out to every sink: dedupe by (sink, alert id), record, queue, never wait."""

    def __init__(
        self,
        sinks: Iterable[AlertSinkConfig],
        data_dir: Path | str,
        currency: str = "USD",
        metrics: DeliveryMetrics | None = None,
        session_factory: Callable[[], requests.Session] = requests.Session,
    ) -> None:
        self.metrics: DeliveryMetrics = metrics or NoMetrics()
        self.log = DeliveryLog(data_dir)
        self.workers = [
            SinkWorker(s, self.log, currency, self.metrics, session_factory()) for s in sinks
        ]
        self.duplicates = 0

    def start(self) -> AlertDispatcher:
        for worker in self.workers:
            worker.start()
        return self

    def submit(self, alerts: Iterable[Alert]) -> int:
        """Queue `alerts` for every sink that has not seen them; how many copies were queued.

        Returns once the copies are durably recorded as queued (so the caller may commit the
        topic offset); delivery happens in the background.
        """
        fresh: list[tuple[SinkWorker, Alert]] = []
        for alert in alerts:
            for worker in self.workers:
                if self.log.known(worker.name, alert.id) or any(
                    w is worker and a.id == alert.id for w, a in fresh
                ):
                    self.duplicates += 1
                    continue
                fresh.append((worker, alert))
        self.log.record(Delivery(w.name, a, DeliveryState.QUEUED) for w, a in fresh)
        for worker, alert in fresh:
            worker.offer(alert)
        return len(fresh)

    def drain(self, timeout_s: float) -> bool:
        """Wait until every queue is empty and nothing is in flight (tests, shutdown)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(w.idle() for w in self.workers):
                return True
            time.sleep(0.02)
        return all(w.idle() for w in self.workers)

    def health(self) -> dict[str, dict[str, Any]]:
        return {
            w.name: {
                "up": w.up,
                "queued": w.queue.qsize(),
                "consecutive_failures": w.consecutive_failures,
                "last_error": w.last_error,
            }
            for w in self.workers
        }

    def stop(self, timeout_s: float = 5.0) -> None:
        for worker in self.workers:
            worker.stop(timeout_s)
        self.log.close()


# ------------------------------------------------------------------------------ test sends


@dataclass(frozen=True, slots=True)
class SendResult:
    sink: str
    kind: SinkKind
    ok: bool
    detail: str
    attempts: int


def send_test(
    config: AlertSinkConfig,
    currency: str = "USD",
    session: requests.Session | None = None,
    attempts: int = 3,
    sleep: Callable[[float], None] = time.sleep,
) -> SendResult:
    """Send a test alert to one sink now (with up to `attempts` tries); for Alertmanager also
    its resolution, so nothing is left firing."""
    http = session or requests.Session()
    alert = sample_alert()
    delay = config.backoff_initial_s
    tries = min(attempts, config.max_attempts)
    outcome = Attempt(False, True, "not tried")
    used = 0
    for used in range(1, tries + 1):
        outcome = post_json(
            http, config.endpoint, payload_for(config, [alert], currency), config.timeout_s,
            config.headers,
        )  # fmt: skip
        if outcome.ok or not outcome.retry or used == tries:
            break
        sleep(delay)
        delay = min(delay * 2, config.backoff_max_s)
    if outcome.ok and config.kind is SinkKind.ALERTMANAGER:
        resolved = replace(alert, kind=AlertKind.RESOLVED, id=alert.id + "-resolved")
        post_json(
            http, config.endpoint, payload_for(config, [resolved], currency), config.timeout_s,
            config.headers,
        )  # fmt: skip
    return SendResult(config.name, config.kind, outcome.ok, outcome.detail, used)


# ------------------------------------------------------------------------------ the loop


async def consume_alerts(
    bootstrap: tuple[str, ...],
    topic: str,
    dispatcher: AlertDispatcher,
    group_id: str = DEFAULT_GROUP_ID,
    client_id: str = "tally-alerts",
    stop: asyncio.Event | None = None,
) -> None:
    """Read the alerts topic and hand alerts to `dispatcher`; commit offsets after `submit`.

    Undecodable messages are logged and skipped (their offsets are committed: they can never
    be delivered).
    """
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=list(bootstrap),
        group_id=group_id,
        client_id=client_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        while stop is None or not stop.is_set():
            batches = await consumer.getmany(timeout_ms=500, max_records=500)
            alerts = []
            for partition, messages in batches.items():
                for message in messages:
                    try:
                        alerts.append(decode_alert(message.value or b""))
                    except ValueError as exc:
                        log.error(
                            "%s[%d]@%d: %s", partition.topic, partition.partition, message.offset,
                            exc,
                        )  # fmt: skip
            if alerts:
                await asyncio.to_thread(dispatcher.submit, alerts)
            if batches:
                await consumer.commit()
    finally:
        with contextlib.suppress(Exception):
            await consumer.stop()
