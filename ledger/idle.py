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
  or resolves an alert);
- a job is one holder whatever is known of its owner (`same_holder`): a sample that names only
  its job (booked to `unallocated:` until the jobs topic makes the owner known) steps the
  detector as that job's, so the late owner's correction re-posts usage whose idle flag is the
  one it would have had, and the owner becoming known continues the episode.

The alerts it emits (`IdleAlert`, `AlertKind`, `ResolveReason`) and their one encoding and
decoding live in `ledger.alerts`; they are re-exported here for the detector's callers.
"""

from __future__ import annotations

from dataclasses import dataclass

from ledger.alerts import AlertKind, IdleAlert, ResolveReason, encode_alert
from ledger.events import Owner
from ledger.fast_build import builder

__all__ = [  # the alert names are re-exported from `ledger.alerts`
    "MINUTE_US",
    "AlertKind",
    "GpuIdleState",
    "IdleAlert",
    "IdleObservation",
    "IdlePolicy",
    "ResolveReason",
    "encode_alert",
    "state_from_row",
    "state_to_row",
    "step",
]

MINUTE_US = 60_000_000


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


_new_state = builder(GpuIdleState)  # `GpuIdleState(...)`, fast (`ledger.fast_build`)


def step(
    state: GpuIdleState | None, obs: IdleObservation, policy: IdlePolicy
) -> tuple[GpuIdleState, tuple[IdleAlert, ...], bool]:
    """Advance one GPU's state by one sample: (new state, alerts, flag this usage as idle).

    The new state is built once from locals (this runs for every sample)."""
    if state is not None and obs.end_us <= state.last_time_us:
        return state, (), False
    alerts: list[IdleAlert] = []
    subject, end, owner = obs.subject, obs.end_us, obs.owner
    if state is None or not same_holder(owner, state.owner):  # a new holder starts from nothing
        if state is not None and state.alert_since_us is not None:
            reason = ResolveReason.RELEASED if owner is None else ResolveReason.OWNER_CHANGED
            alerts.append(_alert(AlertKind.RESOLVED, state, obs, reason))
        below: int | None = None
        busy: int | None = None
        since: int | None = None
        waste_ms = waste_micros = 0
    else:
        below, busy, since = state.below_since_us, state.busy_since_us, state.alert_since_us
        waste_ms, waste_micros = state.waste_gpu_ms, state.waste_micros
    if owner is None:
        return (
            _new_state(subject, end, None, below, busy, since, waste_ms, waste_micros),
            tuple(alerts),
            False,
        )
    idle_now = obs.util_pct < policy.threshold_pct
    if since is None:
        if not idle_now:
            new = _new_state(subject, end, owner, None, busy, None, waste_ms, waste_micros)
            return new, tuple(alerts), False
        if below is None:
            below = obs.start_us
        if end - below >= policy.min_duration_us:
            new = _new_state(subject, end, owner, below, None, below, obs.gpu_ms, obs.cost_micros)
            alerts.append(_alert(AlertKind.DETECTED, new, obs, None))
            return new, tuple(alerts), True
        new = _new_state(subject, end, owner, below, busy, None, waste_ms, waste_micros)
        return new, tuple(alerts), False

    # An alert is open: count waste while idle; resolve after a sustained busy stretch.
    if idle_now:
        new = _new_state(
            subject,
            end,
            owner,
            below,
            None,
            since,
            waste_ms + obs.gpu_ms,
            waste_micros + obs.cost_micros,
        )
        return new, tuple(alerts), True
    if obs.util_pct < policy.resolve_pct:
        new = _new_state(subject, end, owner, below, None, since, waste_ms, waste_micros)
        return new, tuple(alerts), False
    if busy is None:
        busy = obs.start_us
    new = _new_state(subject, end, owner, below, busy, since, waste_ms, waste_micros)
    if end - busy >= policy.resolve_duration_us:
        alerts.append(_alert(AlertKind.RESOLVED, new, obs, ResolveReason.BUSY_AGAIN))
        new = GpuIdleState(subject, end, owner=owner)
    return new, tuple(alerts), False


def same_holder(a: Owner | None, b: Owner | None) -> bool:
    """Whether two observed owners are one holder: equal, or naming the same job (a job whose
    owner was known only late is first observed by its job id alone, then with its team)."""
    if a is None or b is None:
        return a is b
    return a == b or (a.job_id is not None and a.job_id == b.job_id)


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
