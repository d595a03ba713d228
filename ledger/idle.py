"""Idle detection: allocated-but-idle GPUs, as a pure state machine per GPU (or MIG slice).

Two kinds of idle are kept apart everywhere in Tally: *unallocated* capacity (nobody holds the
GPU: the `unallocated:` accounts) and *allocated-but-idle* (an owner holds it and does nothing).
This module owns the second.

Rules (`IdlePolicy`):
- an episode starts with the first sample of an owned GPU whose utilisation is below
  `threshold_pct`; it is confirmed once it has lasted `min_duration_us` (the grace period:
  a short pause is not waste) and then `IdleGpuDetected` is emitted, at most one open alert per
  GPU, with the owner, since-when (the episode start) and the waste so far;
- from confirmation on, the GPU's usage postings are flagged `idle` (still charged to the owner)
  while utilisation stays below the threshold; their money is the waste;
- hysteresis: an open alert resolves (`IdleGpuResolved`) only when utilisation has stayed at or
  above `resolve_pct` for `resolve_duration_us`, or the owner changes or leaves;
- samples older than the last one seen for the GPU are not considered (late data never reopens
  or resolves an alert).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from ledger.envelope import Envelope, encode_data, event_id
from ledger.events import Owner

MINUTE_US = 60_000_000


class AlertKind(StrEnum):
    DETECTED = "tally.idle.detected"
    RESOLVED = "tally.idle.resolved"


class ResolveReason(StrEnum):
    BUSY_AGAIN = "busy_again"
    OWNER_CHANGED = "owner_changed"
    RELEASED = "released"


@dataclass(frozen=True, slots=True)
class IdlePolicy:
    threshold_pct: int = 5
    min_duration_us: int = 30 * MINUTE_US
    resolve_pct: int = 10
    resolve_duration_us: int = 5 * MINUTE_US


@dataclass(frozen=True, slots=True)
class GpuIdleState:
    """What the detector remembers about one GPU subject between samples."""

    subject: str
    last_time_us: int
    owner: Owner | None = None
    below_since_us: int | None = None
    busy_since_us: int | None = None
    alert_since_us: int | None = None
    waste_gpu_ms: int = 0
    waste_micros: int = 0


@dataclass(frozen=True, slots=True)
class IdleObservation:
    """One sample as the detector sees it, with the usage it was charged."""

    subject: str
    gpu_uuid: str
    node: str
    pool: str
    model: str
    owner: Owner | None
    util_pct: int
    start_us: int
    end_us: int
    gpu_ms: int
    cost_micros: int


@dataclass(frozen=True, slots=True)
class IdleAlert:
    """`IdleGpuDetected` or `IdleGpuResolved`."""

    kind: AlertKind
    subject: str
    gpu_uuid: str
    node: str
    pool: str
    model: str
    owner: Owner
    since_us: int
    at_us: int
    waste_gpu_ms: int
    waste_micros: int
    reason: ResolveReason | None = None

    @property
    def id(self) -> str:
        return event_id("tally://idle", f"{self.subject}/{self.since_us}/{self.kind}", self.at_us)


def step(
    state: GpuIdleState | None, obs: IdleObservation, policy: IdlePolicy
) -> tuple[GpuIdleState, tuple[IdleAlert, ...], bool]:
    """Advance one GPU's state by one sample: (new state, alerts, flag this usage as idle)."""
    if state is not None and obs.end_us <= state.last_time_us:
        return state, (), False
    alerts: list[IdleAlert] = []
    if state is None:
        state = GpuIdleState(obs.subject, obs.end_us)
    if state.alert_since_us is not None and obs.owner != state.owner:
        reason = ResolveReason.RELEASED if obs.owner is None else ResolveReason.OWNER_CHANGED
        alerts.append(_alert(AlertKind.RESOLVED, state, obs, reason))
        state = GpuIdleState(obs.subject, state.last_time_us)
    elif obs.owner != state.owner:
        state = GpuIdleState(obs.subject, state.last_time_us)
    state = replace(state, owner=obs.owner, last_time_us=obs.end_us)
    if obs.owner is None:
        return state, tuple(alerts), False

    idle_now = obs.util_pct < policy.threshold_pct
    flag = False
    if state.alert_since_us is None:
        if not idle_now:
            return replace(state, below_since_us=None), tuple(alerts), False
        below = state.below_since_us if state.below_since_us is not None else obs.start_us
        state = replace(state, below_since_us=below)
        if obs.end_us - below >= policy.min_duration_us:
            state = replace(
                state,
                alert_since_us=below,
                waste_gpu_ms=obs.gpu_ms,
                waste_micros=obs.cost_micros,
                busy_since_us=None,
            )
            alerts.append(_alert(AlertKind.DETECTED, state, obs, None))
            flag = True
        return state, tuple(alerts), flag

    # An alert is open: count waste while idle; resolve after a sustained busy stretch.
    if idle_now:
        state = replace(
            state,
            busy_since_us=None,
            waste_gpu_ms=state.waste_gpu_ms + obs.gpu_ms,
            waste_micros=state.waste_micros + obs.cost_micros,
        )
        return state, tuple(alerts), True
    if obs.util_pct < policy.resolve_pct:
        return replace(state, busy_since_us=None), tuple(alerts), False
    busy = state.busy_since_us if state.busy_since_us is not None else obs.start_us
    state = replace(state, busy_since_us=busy)
    if obs.end_us - busy >= policy.resolve_duration_us:
        alerts.append(_alert(AlertKind.RESOLVED, state, obs, ResolveReason.BUSY_AGAIN))
        state = GpuIdleState(obs.subject, obs.end_us, owner=obs.owner)
    return state, tuple(alerts), flag


def _alert(
    kind: AlertKind, state: GpuIdleState, obs: IdleObservation, reason: ResolveReason | None
) -> IdleAlert:
    assert state.owner is not None and state.alert_since_us is not None
    return IdleAlert(
        kind=kind,
        subject=state.subject,
        gpu_uuid=obs.gpu_uuid,
        node=obs.node,
        pool=obs.pool,
        model=obs.model,
        owner=state.owner,
        since_us=state.alert_since_us,
        at_us=obs.end_us,
        waste_gpu_ms=state.waste_gpu_ms,
        waste_micros=state.waste_micros,
        reason=reason,
    )


def encode_alert(alert: IdleAlert) -> bytes:
    """The alert in its envelope, as published on the alerts topic keyed by GPU UUID."""
    owner = alert.owner
    return encode_data(
        Envelope(
            id=alert.id,
            type=alert.kind,
            source="tally://ledger/idle",
            subject=alert.subject,
            time_us=alert.at_us,
            schema=1,
            data={
                "gpu_uuid": alert.gpu_uuid,
                "node": alert.node,
                "pool": alert.pool,
                "model": alert.model,
                "owner": {
                    "team": owner.team,
                    "project": owner.project,
                    "user": owner.user,
                    "job": owner.job_id,
                },
                "since_us": alert.since_us,
                "at_us": alert.at_us,
                "waste_gpu_ms": alert.waste_gpu_ms,
                "waste_micros": alert.waste_micros,
                "reason": alert.reason.value if alert.reason else None,
            },
        )
    )


def state_to_row(state: GpuIdleState) -> tuple[object, ...]:
    owner = state.owner
    return (
        state.subject,
        state.last_time_us,
        owner.team if owner else None,
        owner.project if owner else None,
        owner.user if owner else None,
        owner.job_id if owner else None,
        state.below_since_us,
        state.busy_since_us,
        state.alert_since_us,
        state.waste_gpu_ms,
        state.waste_micros,
    )


def state_from_row(row: tuple[object, ...]) -> GpuIdleState:
    (subject, last, team, project, user, job, below, busy, since, waste_ms, waste_micros) = row
    owner = None
    if team is not None or job is not None:
        owner = Owner(team=_s(team), project=_s(project), user=_s(user), job_id=_s(job))
    return GpuIdleState(
        subject=str(subject),
        last_time_us=int(str(last)),
        owner=owner,
        below_since_us=_i(below),
        busy_since_us=_i(busy),
        alert_since_us=_i(since),
        waste_gpu_ms=int(str(waste_ms)),
        waste_micros=int(str(waste_micros)),
    )


def _s(value: object) -> str | None:
    return None if value is None else str(value)


def _i(value: object) -> int | None:
    return None if value is None else int(str(value))
