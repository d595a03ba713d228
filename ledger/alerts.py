"""Idle-GPU alerts on the alerts topic: the alert as the ledger emits it, its one encoding, and the
one decoder that reads it back.

- `IdleAlert` is what the idle detector (`ledger.idle.step`) emits: `IdleGpuDetected` or
  `IdleGpuResolved`, with the owner, since-when and the waste so far. Its id is content-derived,
  so a resent alert is the same alert.
- `encode_alert` writes it in its CloudEvents envelope (type `AlertKind`, source
  `tally://ledger/idle`, schema 1), as published keyed by GPU UUID.
- `decode_alert` reads such a message back into an `Alert` (flat, with the envelope's id) and
  raises `EventError` for anything else, including the GPU health events
  (`ledger.events.encode_health`) that share the topic. `alert_to_dict` is its inverse, for
  stores that keep decoded alerts (the delivery log).

Every reader of the alerts topic goes through `decode_alert`; the field names live only here.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import orjson

from ledger.envelope import Envelope, encode_data, event_id
from ledger.errors import EventError
from ledger.events import Owner
from ledger.excerpts import ID_LIMIT, bounded, bounded_or_none

ALERT_SOURCE = "tally://ledger/idle"
ALERT_SCHEMA = 1


class AlertKind(StrEnum):
    DETECTED = "tally.idle.detected"
    RESOLVED = "tally.idle.resolved"


class ResolveReason(StrEnum):
    BUSY_AGAIN = "busy_again"
    OWNER_CHANGED = "owner_changed"
    RELEASED = "released"


@dataclass(frozen=True, slots=True)
class IdleAlert:
    """`IdleGpuDetected` or `IdleGpuResolved`, as the idle detector emits it."""

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


@dataclass(frozen=True, slots=True)
class Alert:
    """An idle-GPU alert as read from the alerts topic (`decode_alert`)."""

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


def _data(
    gpu_uuid: str,
    node: str,
    pool: str,
    model: str,
    owner: Owner,
    since_us: int,
    at_us: int,
    waste_gpu_ms: int,
    waste_micros: int,
    reason: str | None,
) -> dict[str, Any]:
    """The envelope's `data`: the one place the alert's field names are written. Its names are
    bounded excerpts (`ledger.excerpts`): decoding bounds a sample's names already, and an alert
    never repeats more than `ID_LIMIT` characters of one whatever made it."""
    return {
        "gpu_uuid": bounded(gpu_uuid, ID_LIMIT),
        "node": bounded(node, ID_LIMIT),
        "pool": bounded(pool, ID_LIMIT),
        "model": bounded(model, ID_LIMIT),
        "owner": {
            "team": bounded_or_none(owner.team, ID_LIMIT),
            "project": bounded_or_none(owner.project, ID_LIMIT),
            "user": bounded_or_none(owner.user, ID_LIMIT),
            "job": bounded_or_none(owner.job_id, ID_LIMIT),
        },
        "since_us": since_us,
        "at_us": at_us,
        "waste_gpu_ms": waste_gpu_ms,
        "waste_micros": waste_micros,
        "reason": bounded_or_none(reason, ID_LIMIT),
    }


def encode_alert(alert: IdleAlert) -> bytes:
    """The alert in its envelope, as published on the alerts topic keyed by GPU UUID."""
    return encode_data(
        Envelope(
            id=alert.id,
            type=alert.kind,
            source=ALERT_SOURCE,
            subject=bounded(alert.subject, ID_LIMIT),
            time_us=alert.at_us,
            schema=ALERT_SCHEMA,
            data=_data(
                alert.gpu_uuid,
                alert.node,
                alert.pool,
                alert.model,
                alert.owner,
                alert.since_us,
                alert.at_us,
                alert.waste_gpu_ms,
                alert.waste_micros,
                alert.reason.value if alert.reason else None,
            ),
        )
    )


def decode_alert(value: bytes | str) -> Alert:
    """An alert from its envelope (or from `alert_to_dict`'s JSON); EventError, with the reason,
    for anything else."""
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
    except (
        orjson.JSONDecodeError,
        KeyError,
        TypeError,
        ValueError,
        AttributeError,
        RecursionError,  # `str` of a value nested too deep (JSON may nest 1,024 levels)
    ) as exc:
        raise EventError(bounded(f"not an idle-GPU alert: {exc!r}")) from exc


def alert_to_dict(alert: Alert) -> dict[str, Any]:
    """The alert as `decode_alert` reads it back (id, type, subject and data)."""
    owner = Owner(alert.team, alert.project, alert.user, alert.job)
    return {
        "id": alert.id,
        "type": alert.kind.value,
        "subject": alert.subject,
        "data": _data(
            alert.gpu_uuid,
            alert.node,
            alert.pool,
            alert.model,
            owner,
            alert.since_us,
            alert.at_us,
            alert.waste_gpu_ms,
            alert.waste_micros,
            alert.reason,
        ),
    }
