"""Alert payloads: what each kind of sink receives for an alert — a Slack incoming webhook,
Alertmanager's `POST /api/v2/alerts`, and the DingTalk, Feishu/Lark and WeCom robots — built
from the words in `streams.alerts.texts`.

Pure functions of the alerts, the currency, the sink's settings and the time; nothing here
sends anything. `request_for` is what delivery calls: where to post and what, signed at the
time of the try for the robots that sign (`streams.alerts.chat`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from ledger.alerts import Alert
from ledger.fleet_alerts import (
    ONE_DAY_US,
    AnyAlert,
    BudgetAlert,
    FleetKind,
    HealthAlert,
    JobAlert,
    RequestAlert,
    one_shot,
)
from streams.alerts.chat import chat_body, signed
from streams.alerts.settings import CHAT_KINDS, SinkKind, SinkSettings
from streams.alerts.texts import facts, hours, iso, money, summary, title, when

ALERT_NAME = "TallyGpuAllocatedIdle"
ALERT_NAMES = {
    FleetKind.BUDGET_THRESHOLD: "TallyBudgetThreshold",
    FleetKind.BUDGET_FORECAST: "TallyBudgetForecast",
    FleetKind.BUDGET_FORECAST_RESOLVED: "TallyBudgetForecast",
    FleetKind.TEAM_IDLE: "TallyTeamIdleGpuHours",
    FleetKind.JOB_IDLE: "TallyJobIdle",
    FleetKind.JOB_IDLE_RESOLVED: "TallyJobIdle",
    FleetKind.JOB_PENDING: "TallyJobPending",
    FleetKind.JOB_PENDING_RESOLVED: "TallyJobPending",
    FleetKind.GPU_HEALTH: "TallyGpuHealth",
    FleetKind.GPU_HEALTH_RESOLVED: "TallyGpuHealth",
    FleetKind.REQUEST_OPENED: "TallyRequestOpened",
    FleetKind.REQUEST_APPROVED: "TallyRequestApproved",
    FleetKind.REQUEST_REJECTED: "TallyRequestRejected",
    FleetKind.REQUEST_EXPIRED: "TallyRequestExpired",
    FleetKind.REQUEST_REFUSED: "TallyRequestRefused",
}


def _icon(alert: AnyAlert) -> str:
    return ":white_check_mark:" if alert.resolved else ":warning:"


def slack_payload(
    alert: AnyAlert, currency: str, dashboard_url: str | None = None
) -> dict[str, Any]:
    """A Slack incoming-webhook message (`text` for notifications, `blocks` for the layout)."""
    text = f"{_icon(alert)} {summary(alert, currency)}"
    if isinstance(alert, Alert):
        fields = [(k, f"`{v}`" if k == "GPU" else v) for k, v in facts(alert, currency)]
        context = f"Tally idle-GPU alert `{alert.id}`"
    else:
        fields = facts(alert, currency)
        context = f"Tally alert {alert.kind.value} `{alert.id}`"
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": {"type": "mrkdwn", "text": text}},
        {
            "type": "section",
            "fields": [{"type": "mrkdwn", "text": f"*{k}*\n{v}"} for k, v in fields[:10]],
        },
    ]
    if dashboard_url:
        context += f" · <{dashboard_url}|open the dashboard>"
    blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": context}]})
    return {"text": text, "blocks": blocks}


def alertmanager_labels(alert: AnyAlert) -> dict[str, str]:
    """The alert's identity in Alertmanager: the same for its detection and its resolution."""
    labels: dict[str, str | None]
    if isinstance(alert, Alert):
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
    elif isinstance(alert, HealthAlert):
        labels = {
            "alertname": ALERT_NAMES[alert.kind],
            "severity": "warning",  # constant: the resolution must name the same alert
            "source": "tally",
            "gpu_uuid": alert.gpu_uuid,
            "node": alert.node,
            "pool": alert.pool,
            "model": alert.model,
        }
    else:
        labels = {
            "alertname": ALERT_NAMES[alert.kind],
            "severity": "warning",
            "source": "tally",
            "team": alert.team,
        }
        if isinstance(alert, BudgetAlert):
            labels |= {"period": alert.period, "unit": alert.unit}
            if alert.threshold_pct is not None:
                labels["threshold_pct"] = str(alert.threshold_pct)
        elif isinstance(alert, JobAlert):
            labels |= {"job": alert.job, "queue": alert.queue}
        elif isinstance(alert, RequestAlert):
            labels |= {"request_id": alert.request_id, "severity": "info"}
        else:
            labels["day"] = iso(alert.day_start_us)[:10]
    return {k: v for k, v in labels.items() if v}


def _starts_us(alert: AnyAlert) -> int:
    if isinstance(alert, Alert):
        return alert.since_us
    if isinstance(alert, JobAlert):
        return alert.since_us + alert.limit_us
    if isinstance(alert, HealthAlert):
        return alert.since_us
    if isinstance(alert, BudgetAlert) and not one_shot(alert):
        return alert.period_start_us
    return alert.at_us


def alertmanager_payload(
    alerts: Iterable[AnyAlert],
    currency: str,
    dashboard_url: str | None = None,
    firing_ends_us: int | None = None,
) -> list[dict[str, Any]]:
    """The body of `POST /api/v2/alerts`. Resolved alerts carry `endsAt` (their resolve
    time); one-shot alerts (a threshold crossed, a day over) end a day after they fired;
    firing ones carry `firing_ends_us` when given (their expiry unless re-sent)."""
    out = []
    for alert in alerts:
        annotations = {"summary": summary(alert, currency), "alert_id": alert.id}
        if isinstance(alert, Alert):
            annotations |= {
                "idle_since": iso(alert.since_us),
                "waste": money(alert.waste_micros, currency),
                "waste_gpu_hours": hours(alert.waste_gpu_ms),
            }
        elif isinstance(alert, HealthAlert):
            annotations |= {"state": alert.state, "reason": alert.reason}
        item: dict[str, Any] = {
            "labels": alertmanager_labels(alert),
            "annotations": annotations,
            "startsAt": iso(_starts_us(alert)),
        }
        if alert.resolved:
            item["endsAt"] = iso(alert.at_us)
        elif one_shot(alert):
            item["endsAt"] = iso(alert.at_us + ONE_DAY_US)
        elif firing_ends_us is not None:
            item["endsAt"] = iso(firing_ends_us)
        if dashboard_url:
            item["generatorURL"] = dashboard_url
        out.append(item)
    return out


def chat_payload(
    kind: SinkKind, alert: AnyAlert, currency: str, dashboard_url: str | None = None
) -> dict[str, Any]:
    """The unsigned body for a DingTalk, Feishu or WeCom robot: title, summary, then facts."""
    head = title(alert)
    line = summary(alert, currency)
    rows = facts(alert, currency)
    markdown = [f"#### {head}", "", line, ""]
    markdown += [f"- **{label}**: {value}" for label, value in rows]
    plain = [head, line, ""] + [f"{label}: {value}" for label, value in rows]
    tail = f"alert {alert.id} · {when(alert.at_us)}"
    markdown += ["", f"> {tail}"]
    plain += ["", tail]
    if dashboard_url:
        markdown.append(f"> [Open the dashboard]({dashboard_url})")
        plain.append(f"Dashboard: {dashboard_url}")
    return chat_body(kind, head, "\n".join(markdown), "\n".join(plain))


def payload_for(
    sink: SinkSettings, alerts: list[AnyAlert], currency: str, now_us: int | None = None
) -> Any:
    """The unsigned body to post to `sink` for `alerts` (every kind but Alertmanager: exactly
    one alert per message)."""
    if sink.kind is SinkKind.SLACK:
        assert len(alerts) == 1
        return slack_payload(alerts[0], currency, sink.dashboard_url)
    if sink.kind in CHAT_KINDS:
        assert len(alerts) == 1
        return chat_payload(sink.kind, alerts[0], currency, sink.dashboard_url)
    ends = None
    if sink.resend_interval_s > 0:
        now = now_us if now_us is not None else time.time_ns() // 1_000
        ends = now + int(4 * sink.resend_interval_s * 1_000_000)
    return alertmanager_payload(alerts, currency, sink.dashboard_url, ends)


def request_for(
    sink: SinkSettings, alerts: list[AnyAlert], currency: str, now_us: int | None = None
) -> tuple[str, Any]:
    """Where to post and what, for one try now: the payload, signed at `now_us` (default: the
    clock) when the sink signs."""
    now = now_us if now_us is not None else time.time_ns() // 1_000
    body = payload_for(sink, alerts, currency, now)
    if sink.kind in CHAT_KINDS:
        return signed(sink.kind, sink.endpoint, body, sink.secret, now)
    return sink.endpoint, body
