"""Alert payloads: what a Slack incoming webhook and Alertmanager's `POST /api/v2/alerts` receive
for an alert, and the one-line summary a person reads in both.

Pure functions of the alert, the currency and the sink's settings; nothing here sends anything.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from datetime import UTC, datetime
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

from ledger.alerts import Alert
from ledger.units import MICROS_PER_UNIT, MS_PER_HOUR
from streams.alerts.settings import SinkKind, SinkSettings

ALERT_NAME = "TallyGpuAllocatedIdle"


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


def payload_for(
    sink: SinkSettings, alerts: list[Alert], currency: str, now_us: int | None = None
) -> Any:
    """The body to post to `sink` for `alerts` (Slack: exactly one alert per message)."""
    if sink.kind is SinkKind.SLACK:
        assert len(alerts) == 1
        return slack_payload(alerts[0], currency, sink.dashboard_url)
    ends = None
    if sink.resend_interval_s > 0:
        now = now_us if now_us is not None else time.time_ns() // 1_000
        ends = now + int(4 * sink.resend_interval_s * 1_000_000)
    return alertmanager_payload(alerts, currency, sink.dashboard_url, ends)
