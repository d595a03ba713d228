"""Budget, abuse and waiting alerts on the alerts topic, beside the idle-GPU alerts of
`ledger.alerts`: the events, their one encoding, and the one decoder for every alert.

- `BudgetAlert`: a team's consumption in a period crossed a threshold (`tally.budget.threshold`,
  once per team, period, unit and threshold), or its burn rate is forecast to exceed the budget
  before the period ends (`tally.budget.forecast`, resolved by `tally.budget.forecast.resolved`
  when the forecast no longer exceeds it).
- `TeamIdleAlert`: a team's allocated-but-idle GPU time in one UTC day went over a threshold
  (`tally.team.idle`, once per team and day).
- `HealthAlert`: a GPU went degraded or unhealthy (`tally.gpu.health.alert`, raised by the
  ledger worker from the inventory's health fold, `ledger.inventory.alerts`), resolved by
  `tally.gpu.health.resolved` when it is healthy again.
- `RequestAlert`: a quota or budget request was opened, approved, rejected or expired
  (`tally.request.opened` / `.approved` / `.rejected` / `.expired`, raised by the ledger worker
  from the admin fold, `ledger.admin.requests`); each step is reported once. The ledger refused
  a decision step (`tally.request.refused`: `step` the refused event's id, `comment` the
  ledger's reason), once per refused step: how the scheduler's request desk learns it.
- `JobAlert`: a job holds GPUs idle longer than its queue allows (`tally.job.idle`, resolved by
  `tally.job.idle.resolved`), or waits longer than its queue's threshold
  (`tally.job.pending`, resolved by `tally.job.pending.resolved` once admitted or ended).

Ids are content-derived and never include the time an alert was noticed, only what makes it
the same alert (the team, period, unit and threshold; the team and day; the job and the start
of its idle or waiting episode): whoever emits an alert again emits the same id, and delivery
deduplicates it. `AnyAlert` is every alert the topic carries; `decode_any_alert` reads each of
them (and raises `EventError` for anything else, raw GPU health events included) and
`any_alert_to_dict` is its inverse.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import orjson

from ledger.alerts import Alert, alert_to_dict, decode_alert
from ledger.envelope import Envelope, encode_data, event_id
from ledger.errors import EventError
from ledger.excerpts import ID_LIMIT, bounded, bounded_or_none

FLEET_SOURCE = "tally://alerts"
FLEET_SCHEMA = 1
ONE_DAY_US = 86_400_000_000


class FleetKind(StrEnum):
    BUDGET_THRESHOLD = "tally.budget.threshold"
    BUDGET_FORECAST = "tally.budget.forecast"
    BUDGET_FORECAST_RESOLVED = "tally.budget.forecast.resolved"
    TEAM_IDLE = "tally.team.idle"
    JOB_IDLE = "tally.job.idle"
    JOB_IDLE_RESOLVED = "tally.job.idle.resolved"
    JOB_PENDING = "tally.job.pending"
    JOB_PENDING_RESOLVED = "tally.job.pending.resolved"
    GPU_HEALTH = "tally.gpu.health.alert"
    GPU_HEALTH_RESOLVED = "tally.gpu.health.resolved"
    REQUEST_OPENED = "tally.request.opened"
    REQUEST_APPROVED = "tally.request.approved"
    REQUEST_REJECTED = "tally.request.rejected"
    REQUEST_EXPIRED = "tally.request.expired"
    REQUEST_REFUSED = "tally.request.refused"  # the ledger refused a decision step


RESOLVING = frozenset(
    {
        FleetKind.BUDGET_FORECAST_RESOLVED,
        FleetKind.JOB_IDLE_RESOLVED,
        FleetKind.JOB_PENDING_RESOLVED,
        FleetKind.GPU_HEALTH_RESOLVED,
    }
)
REQUEST_KINDS = frozenset(
    {
        FleetKind.REQUEST_OPENED,
        FleetKind.REQUEST_APPROVED,
        FleetKind.REQUEST_REJECTED,
        FleetKind.REQUEST_EXPIRED,
        FleetKind.REQUEST_REFUSED,
    }
)
ONE_SHOT = frozenset({FleetKind.BUDGET_THRESHOLD, FleetKind.TEAM_IDLE}) | REQUEST_KINDS
BUDGET_KINDS = frozenset(
    {FleetKind.BUDGET_THRESHOLD, FleetKind.BUDGET_FORECAST, FleetKind.BUDGET_FORECAST_RESOLVED}
)
JOB_KINDS = frozenset(
    {
        FleetKind.JOB_IDLE,
        FleetKind.JOB_IDLE_RESOLVED,
        FleetKind.JOB_PENDING,
        FleetKind.JOB_PENDING_RESOLVED,
    }
)


def _id(subject: str, kind: FleetKind, since_us: int) -> str:
    return event_id(FLEET_SOURCE, f"{subject}/{kind}", since_us)


@dataclass(frozen=True, slots=True)
class BudgetAlert:
    """A team's budget line in a period: a threshold crossed, or a forecast overrun.

    `granted` and `consumed` are in `unit` (integer GPU-ms or money micro-units) as the balances
    topic reports them at `at_us`. `threshold_pct` is set for threshold alerts; `forecast` (the
    consumption the current burn rate reaches at `period_end_us`) and `exceed_at_us` (when it
    reaches the budget) for forecast alerts.
    """

    kind: FleetKind
    team: str
    period: str
    unit: str
    granted: int
    consumed: int
    period_start_us: int
    period_end_us: int
    at_us: int
    threshold_pct: int | None = None
    forecast: int | None = None
    exceed_at_us: int | None = None

    @property
    def subject(self) -> str:
        return f"{self.team}/{self.period}/{self.unit}"

    @property
    def episode(self) -> tuple[str, int]:
        if self.kind is FleetKind.BUDGET_THRESHOLD:
            return f"budget/{self.subject}/{self.threshold_pct}", self.period_start_us
        return f"budget-forecast/{self.subject}", self.period_start_us

    @property
    def id(self) -> str:
        return _id(self.episode[0], self.kind, self.period_start_us)

    @property
    def resolved(self) -> bool:
        return self.kind in RESOLVING


@dataclass(frozen=True, slots=True)
class TeamIdleAlert:
    """A team's allocated-but-idle GPU time in the UTC day starting `day_start_us`."""

    team: str
    day_start_us: int
    idle_gpu_ms: int
    threshold_gpu_ms: int
    at_us: int

    @property
    def kind(self) -> FleetKind:
        return FleetKind.TEAM_IDLE

    @property
    def subject(self) -> str:
        return self.team

    @property
    def episode(self) -> tuple[str, int]:
        return f"team-idle/{self.team}", self.day_start_us

    @property
    def id(self) -> str:
        return _id(self.episode[0], self.kind, self.day_start_us)

    @property
    def resolved(self) -> bool:
        return False


@dataclass(frozen=True, slots=True)
class JobAlert:
    """A job idle past its queue's allowance, or waiting past its queue's threshold.

    `since_us` starts the episode (idle since; submitted); `limit_us` is what the queue allows;
    `gpus` what the job holds (idle) or asks for (pending), `idle_gpus` how many of them are
    idle; `reason` why it waits (pending) or how the episode ended (resolved).
    """

    kind: FleetKind
    job: str
    team: str
    queue: str
    since_us: int
    at_us: int
    limit_us: int
    gpus: int
    idle_gpus: int = 0
    reason: str | None = None

    @property
    def subject(self) -> str:
        return self.job

    @property
    def episode(self) -> tuple[str, int]:
        idle = self.kind in (FleetKind.JOB_IDLE, FleetKind.JOB_IDLE_RESOLVED)
        family = "job-idle" if idle else "job-pending"
        return f"{family}/{self.job}", self.since_us

    @property
    def id(self) -> str:
        return _id(self.episode[0], self.kind, self.since_us)

    @property
    def resolved(self) -> bool:
        return self.kind in RESOLVING


@dataclass(frozen=True, slots=True)
class HealthAlert:
    """A GPU went degraded or unhealthy (`tally.gpu.health.alert`, raised again when it gets
    worse), or is healthy again (`tally.gpu.health.resolved`).

    `since_us` starts the episode (when it stopped being healthy); `state` is the state
    raised (`degraded` / `unhealthy`; `healthy` when resolved); `reason` the fault's meaning
    (an XID's words for the common codes, `ledger.inventory.health`); `faults` the GPU's
    fault count so far.
    """

    kind: FleetKind
    gpu_uuid: str
    node: str
    pool: str
    model: str
    state: str
    reason: str
    since_us: int
    at_us: int
    faults: int = 0

    @property
    def subject(self) -> str:
        return self.gpu_uuid

    @property
    def episode(self) -> tuple[str, int]:
        return f"gpu-health/{self.gpu_uuid}", self.since_us

    @property
    def id(self) -> str:
        return _id(f"{self.episode[0]}/{self.state}", self.kind, self.since_us)

    @property
    def resolved(self) -> bool:
        return self.kind in RESOLVING


@dataclass(frozen=True, slots=True)
class RequestAlert:
    """A step of a quota or budget request: `actor` (as `role`) opened, approved, rejected or
    expired it at `at_us`; `change` says what it asks (e.g. `budget 2026-11 money +1500000000`),
    `approvers` who may decide it, `comment` the reason or the approver's comment."""

    kind: FleetKind
    request_id: str
    team: str
    change: str
    actor: str
    role: str
    comment: str
    approvers: str
    at_us: int
    step: str = ""  # a refusal's: the id of the refused step's event (`comment`: the reason)

    @property
    def subject(self) -> str:
        return self.request_id

    @property
    def episode(self) -> tuple[str, int]:
        return f"request/{self.request_id}", 0

    @property
    def id(self) -> str:
        if self.step:  # one per refused step
            return _id(f"{self.episode[0]}/{self.step}", self.kind, 0)
        return _id(self.episode[0], self.kind, 0)  # one alert per request and step

    @property
    def resolved(self) -> bool:
        return False


FleetAlert = BudgetAlert | TeamIdleAlert | JobAlert | HealthAlert | RequestAlert
AnyAlert = Alert | FleetAlert


def one_shot(alert: AnyAlert) -> bool:
    """Alerts that report an event, not a condition: never resolved."""
    return not isinstance(alert, Alert) and alert.kind in ONE_SHOT


def _data(alert: FleetAlert) -> dict[str, Any]:
    """The envelope's `data`: the one place these alerts' field names are written."""
    if isinstance(alert, BudgetAlert):
        return {
            "team": bounded(alert.team, ID_LIMIT),
            "period": bounded(alert.period, ID_LIMIT),
            "unit": bounded(alert.unit, ID_LIMIT),
            "granted": alert.granted,
            "consumed": alert.consumed,
            "period_start_us": alert.period_start_us,
            "period_end_us": alert.period_end_us,
            "at_us": alert.at_us,
            "threshold_pct": alert.threshold_pct,
            "forecast": alert.forecast,
            "exceed_at_us": alert.exceed_at_us,
        }
    if isinstance(alert, HealthAlert):
        return {
            "gpu_uuid": bounded(alert.gpu_uuid, ID_LIMIT),
            "node": bounded(alert.node, ID_LIMIT),
            "pool": bounded(alert.pool, ID_LIMIT),
            "model": bounded(alert.model, ID_LIMIT),
            "state": alert.state,
            "reason": bounded(alert.reason, ID_LIMIT),
            "since_us": alert.since_us,
            "at_us": alert.at_us,
            "faults": alert.faults,
        }
    if isinstance(alert, RequestAlert):
        return {
            "request_id": bounded(alert.request_id, ID_LIMIT),
            "team": bounded(alert.team, ID_LIMIT),
            "change": bounded(alert.change, ID_LIMIT),
            "actor": bounded(alert.actor, ID_LIMIT),
            "role": bounded(alert.role, ID_LIMIT),
            "comment": bounded(alert.comment, ID_LIMIT),
            "approvers": bounded(alert.approvers, ID_LIMIT),
            "at_us": alert.at_us,
            **({"step": bounded(alert.step, ID_LIMIT)} if alert.step else {}),
        }
    if isinstance(alert, TeamIdleAlert):
        return {
            "team": bounded(alert.team, ID_LIMIT),
            "day_start_us": alert.day_start_us,
            "idle_gpu_ms": alert.idle_gpu_ms,
            "threshold_gpu_ms": alert.threshold_gpu_ms,
            "at_us": alert.at_us,
        }
    return {
        "job": bounded(alert.job, ID_LIMIT),
        "team": bounded(alert.team, ID_LIMIT),
        "queue": bounded(alert.queue, ID_LIMIT),
        "since_us": alert.since_us,
        "at_us": alert.at_us,
        "limit_us": alert.limit_us,
        "gpus": alert.gpus,
        "idle_gpus": alert.idle_gpus,
        "reason": bounded_or_none(alert.reason, ID_LIMIT),
    }


def encode_fleet_alert(alert: FleetAlert) -> bytes:
    """The alert in its envelope, as published on the alerts topic (keyed by `alert_key`)."""
    return encode_data(
        Envelope(
            id=alert.id,
            type=alert.kind,
            source=FLEET_SOURCE,
            subject=bounded(alert.subject, ID_LIMIT),
            time_us=alert.at_us,
            schema=FLEET_SCHEMA,
            data=_data(alert),
        )
    )


def alert_key(alert: FleetAlert) -> bytes:
    """The message key: the team for team and request alerts, the job for job alerts, the GPU
    for health alerts."""
    if isinstance(alert, HealthAlert):
        return alert.gpu_uuid.encode()
    return (alert.job if isinstance(alert, JobAlert) else alert.team).encode()


def _int(data: dict[str, Any], key: str) -> int:
    value = data[key]
    if type(value) is not int:
        raise TypeError(f"{key}: expected an integer")
    return value


def _opt_int(data: dict[str, Any], key: str) -> int | None:
    value = data.get(key)
    return None if value is None else _int(data, key)


def _str(data: dict[str, Any], key: str) -> str:
    value = data[key]
    if type(value) is not str:
        raise TypeError(f"{key}: expected a string")
    return value


_REQUEST_TEXTS = ("request_id", "team", "change", "actor", "role", "comment", "approvers")


def _fleet_from(doc: dict[str, Any], kind: FleetKind) -> FleetAlert:
    data = doc["data"]
    if kind in BUDGET_KINDS:
        return BudgetAlert(
            kind=kind,
            team=_str(data, "team"),
            period=_str(data, "period"),
            unit=_str(data, "unit"),
            granted=_int(data, "granted"),
            consumed=_int(data, "consumed"),
            period_start_us=_int(data, "period_start_us"),
            period_end_us=_int(data, "period_end_us"),
            at_us=_int(data, "at_us"),
            threshold_pct=_opt_int(data, "threshold_pct"),
            forecast=_opt_int(data, "forecast"),
            exceed_at_us=_opt_int(data, "exceed_at_us"),
        )
    if kind in (FleetKind.GPU_HEALTH, FleetKind.GPU_HEALTH_RESOLVED):
        return HealthAlert(
            kind=kind,
            gpu_uuid=_str(data, "gpu_uuid"),
            node=_str(data, "node"),
            pool=_str(data, "pool"),
            model=_str(data, "model"),
            state=_str(data, "state"),
            reason=_str(data, "reason"),
            since_us=_int(data, "since_us"),
            at_us=_int(data, "at_us"),
            faults=_int(data, "faults"),
        )
    if kind in REQUEST_KINDS:
        return RequestAlert(
            kind=kind,
            **{k: _str(data, k) for k in _REQUEST_TEXTS},
            at_us=_int(data, "at_us"),
            step=_str(data, "step") if "step" in data else "",
        )
    if kind is FleetKind.TEAM_IDLE:
        return TeamIdleAlert(
            team=_str(data, "team"),
            day_start_us=_int(data, "day_start_us"),
            idle_gpu_ms=_int(data, "idle_gpu_ms"),
            threshold_gpu_ms=_int(data, "threshold_gpu_ms"),
            at_us=_int(data, "at_us"),
        )
    reason = data.get("reason")
    return JobAlert(
        kind=kind,
        job=_str(data, "job"),
        team=_str(data, "team"),
        queue=_str(data, "queue"),
        since_us=_int(data, "since_us"),
        at_us=_int(data, "at_us"),
        limit_us=_int(data, "limit_us"),
        gpus=_int(data, "gpus"),
        idle_gpus=_int(data, "idle_gpus"),
        reason=reason if type(reason) is str else None,
    )


def decode_any_alert(value: bytes | str) -> AnyAlert:
    """Any alert from its envelope (or from `any_alert_to_dict`'s JSON): an idle-GPU alert
    through `ledger.alerts.decode_alert`, the others here. EventError for anything else."""
    try:
        doc = orjson.loads(value)
        raw = doc.get("type") if type(doc) is dict else None
        kind = FleetKind(raw) if type(raw) is str and raw in _FLEET else None
    except orjson.JSONDecodeError:
        kind = None
    if kind is None:
        return decode_alert(value)
    try:
        return _fleet_from(doc, kind)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise EventError(bounded(f"not a {kind.value} alert: {exc!r}")) from exc


_FLEET = frozenset(k.value for k in FleetKind)


def any_alert_to_dict(alert: AnyAlert) -> dict[str, Any]:
    """The alert as `decode_any_alert` reads it back."""
    if isinstance(alert, Alert):
        return alert_to_dict(alert)
    return {
        "id": alert.id,
        "type": alert.kind.value,
        "subject": alert.subject,
        "data": _data(alert),
    }
