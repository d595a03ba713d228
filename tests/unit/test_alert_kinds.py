"""Budget, team-idle and job alerts end to end without a broker: their one encoding, the words
each sink gets for them, the budget and idle-time watch of `tally alerts run`
(`streams.alerts.watch.AlertWatch`), and the scheduler raising and resolving job alerts
(`scheduler.job_alerts`) on a dispatcher with the fake executor."""

from __future__ import annotations

import asyncio

import pytest

from ledger.alert_rules import BudgetRules
from ledger.alerts import AlertKind, decode_alert
from ledger.errors import EventError
from ledger.fleet_alerts import (
    AnyAlert,
    BudgetAlert,
    FleetKind,
    JobAlert,
    RequestAlert,
    TeamIdleAlert,
    any_alert_to_dict,
    decode_any_alert,
    encode_fleet_alert,
)
from ledger.periods import Period
from scheduler.executors.fake import RUNS_FOREVER
from scheduler.job_alerts import JobAlertWatch
from scheduler.service import SchedulerService
from streams.alerts.payloads import alertmanager_payload, chat_payload, slack_payload
from streams.alerts.settings import SinkKind
from streams.alerts.texts import summary
from streams.alerts.watch import AlertWatch, WatchRules
from tests.unit.test_scheduler_service_support import (
    HOUR_US,
    MINUTE_US,
    T0_US,
    Rig,
    budget_update,
    config_data,
    idle_alert,
)

NOV = Period.month("2026-11")
DAY_US = 24 * HOUR_US


def _threshold() -> BudgetAlert:
    return BudgetAlert(
        FleetKind.BUDGET_THRESHOLD,
        "vision",
        "2026-11",
        "gpu_ms",
        1_000 * 3_600_000,
        812 * 3_600_000,
        NOV.start_us,
        NOV.end_us,
        T0_US + 20 * DAY_US,
        threshold_pct=80,
    )


def _forecast() -> BudgetAlert:
    return BudgetAlert(
        FleetKind.BUDGET_FORECAST,
        "vision",
        "2026-11",
        "money_micros",
        1_000_000_000,
        150_000_000,
        NOV.start_us,
        NOV.end_us,
        T0_US + 3 * DAY_US,
        forecast=1_500_000_000,
        exceed_at_us=T0_US + 20 * DAY_US,
    )


def _team_idle() -> TeamIdleAlert:
    return TeamIdleAlert("vision", T0_US, 30 * 3_600_000, 24 * 3_600_000, T0_US + 20 * HOUR_US)


def _request(kind: FleetKind, actor: str, role: str, comment: str) -> RequestAlert:
    return RequestAlert(
        kind=kind,
        request_id="req-0123456789abcdef",
        team="vision",
        change="budget 2026-11 money_micros +1500000000",
        actor=actor,
        role=role,
        comment=comment,
        approvers="finance",
        at_us=T0_US + 3_600_000_000,
    )


def _job(kind: FleetKind, reason: str | None = None) -> JobAlert:
    return JobAlert(
        kind,
        "job-9",
        "vision",
        "train",
        T0_US,
        T0_US + 3 * HOUR_US + 5 * MINUTE_US,
        HOUR_US,
        4,
        2,
        reason,
    )


KINDS: list[tuple[AnyAlert, str]] = [
    (
        _threshold(),
        "Budget: team vision's 2026-11 budget crossed 80% — 812.00 GPU-hours of 1000.00 GPU-hours "
        "used (81%) as of 2026-11-21 00:00 UTC.",
    ),
    (
        _forecast(),
        "Budget forecast: at its current burn rate team vision's 2026-11 budget will be exceeded "
        "before the period ends — 150.00 EUR of 1,000.00 EUR used as of 2026-11-04 00:00 UTC; "
        "1,500.00 EUR by 2026-12-01 00:00 UTC, the budget reached around 2026-11-21 00:00 UTC.",
    ),
    (
        _team_idle(),
        "Team vision held 30.00 allocated-but-idle GPU-hours on 2026-11-01 (UTC), over the daily "
        "threshold of 24.00 GPU-hours (as of 2026-11-01 20:00 UTC).",
    ),
    (
        _job(FleetKind.JOB_IDLE),
        "Job job-9 (team vision, queue train) holds 2 of 4 GPU(s) idle since 2026-11-01 00:00 UTC "
        "(3 h 05 min), longer than its queue allows (1 h 00 min).",
    ),
    (
        _job(FleetKind.JOB_PENDING, "quota_exhausted"),
        "Job job-9 (team vision, queue train), asking for 4 GPU(s), has been pending for "
        "3 h 05 min since 2026-11-01 00:00 UTC, longer than the queue's threshold of 1 h 00 min. "
        "Waiting: quota_exhausted.",
    ),
    (
        _job(FleetKind.JOB_PENDING_RESOLVED, "admitted"),
        "Resolved: Job job-9 (team vision, queue train) is no longer pending (admitted), after "
        "waiting 3 h 05 min.",
    ),
    (
        _request(FleetKind.REQUEST_OPENED, "team:vision", "team-lead", "a bigger sweep"),
        "team:vision (team-lead) asks for budget 2026-11 money_micros +1500000000 for team "
        "vision (request req-0123456789abcdef; approvers: finance): a bigger sweep",
    ),
    (
        _request(FleetKind.REQUEST_APPROVED, "finance:books", "finance", "go ahead"),
        "Request req-0123456789abcdef of team vision (budget 2026-11 money_micros +1500000000) "
        "approved by finance:books (finance) at 2026-11-01 01:00 UTC: go ahead",
    ),
    (
        _request(FleetKind.REQUEST_REJECTED, "finance:books", "finance", "not this month"),
        "Request req-0123456789abcdef of team vision (budget 2026-11 money_micros +1500000000) "
        "rejected by finance:books (finance) at 2026-11-01 01:00 UTC: not this month",
    ),
    (
        _request(FleetKind.REQUEST_EXPIRED, "ops", "admin", "expired unanswered"),
        "Request req-0123456789abcdef of team vision (budget 2026-11 money_micros +1500000000) "
        "expired by ops (admin) at 2026-11-01 01:00 UTC: expired unanswered",
    ),
]


@pytest.mark.parametrize(
    ("alert", "text"),
    KINDS,
    ids=[
        "threshold",
        "forecast",
        "team-idle",
        "job-idle",
        "job-pending",
        "pending-resolved",
        "request-opened",
        "request-approved",
        "request-rejected",
        "request-expired",
    ],
)
def test_each_kind_round_trips_and_reads_well_in_every_sink(alert, text):
    assert decode_any_alert(encode_fleet_alert(alert)) == alert
    assert decode_any_alert(orjson_dumps(any_alert_to_dict(alert))) == alert
    assert summary(alert, "EUR") == text
    slack = slack_payload(alert, "EUR")
    icon = ":white_check_mark:" if alert.resolved else ":warning:"
    assert slack["text"] == f"{icon} {text}"
    (item,) = alertmanager_payload([alert], "EUR")
    assert item["annotations"]["summary"] == text and item["labels"]["team"] == "vision"
    assert item["labels"]["alertname"].startswith("Tally")
    for kind in (SinkKind.DINGTALK, SinkKind.WECOM):
        body = chat_payload(kind, alert, "EUR")
        markdown = body["markdown"].get("text") or body["markdown"]["content"]
        assert text in markdown and "- **Team**: vision" in markdown
    assert text in chat_payload(SinkKind.FEISHU, alert, "EUR")["content"]["text"]


def test_one_shot_alerts_end_in_alertmanager_and_resolutions_share_labels():
    (threshold,) = alertmanager_payload([_threshold()], "EUR")
    assert threshold["endsAt"] == "2026-11-22T00:00:00Z"  # a day after it fired
    fire, resolve = alertmanager_payload(
        [_job(FleetKind.JOB_IDLE), _job(FleetKind.JOB_IDLE_RESOLVED)], "EUR"
    )
    assert fire["labels"] == resolve["labels"]
    assert fire["labels"] | {} == {
        "alertname": "TallyJobIdle",
        "severity": "warning",
        "source": "tally",
        "team": "vision",
        "job": "job-9",
        "queue": "train",
    }
    assert "endsAt" not in fire and resolve["endsAt"] == "2026-11-01T03:05:00Z"


def test_idle_gpu_alerts_still_decode_and_junk_is_refused():
    raw = idle_alert("GPU-1", T0_US, "job-1")
    assert decode_any_alert(raw) == decode_alert(raw)
    with pytest.raises(EventError, match=r"not a tally\.job\.idle alert"):
        decode_any_alert(b'{"type": "tally.job.idle", "data": {"job": 1}}')
    with pytest.raises(EventError, match="not an idle-GPU alert"):
        decode_any_alert(b"junk")


def test_the_watch_raises_budget_alerts_once_and_remembers_them_across_a_restart():
    rules = WatchRules(BudgetRules(forecast=False))
    watch = AlertWatch(rules)
    update = budget_update("vision", 1, gpu_granted=1_000, gpu_consumed=850)
    assert watch.on_balance(update.budget, T0_US + DAY_US, live=False) == []  # replaying
    raised = watch.catch_up()
    assert [(a.kind, a.threshold_pct) for a in raised] == [
        (FleetKind.BUDGET_THRESHOLD, 50),
        (FleetKind.BUDGET_THRESHOLD, 80),
    ]
    restarted = AlertWatch(rules)  # reads its own alerts back from the topic first
    for alert in raised:
        restarted.on_alert(decode_any_alert(encode_fleet_alert(alert)))
    restarted.on_balance(update.budget, T0_US + DAY_US, live=False)
    assert restarted.catch_up() == []
    more = budget_update("vision", 2, gpu_granted=1_000, gpu_consumed=1_000)
    (full,) = restarted.on_balance(more.budget, T0_US + 2 * DAY_US, live=True)
    assert full.threshold_pct == 100


def test_the_watch_adds_up_a_teams_idle_gpus_per_day():
    watch = AlertWatch(WatchRules(budget=None, team_idle_gpu_ms=7_800_000))  # 2 h 10 min
    for gpu in ("GPU-1", "GPU-2"):
        watch.on_alert(decode_alert(idle_alert(gpu, T0_US, "job-1")))  # at +10 min
    assert watch.idle_check() == []  # 2 × 10 min so far
    resolved = idle_alert("GPU-1", T0_US, "job-1", AlertKind.RESOLVED)
    watch.on_alert(decode_alert(resolved))  # GPU-1: 10 min
    balance = budget_update("vision", 1, gpu_granted=10, as_of_us=T0_US + 2 * HOUR_US)
    watch.on_balance(balance.budget, T0_US + 2 * HOUR_US, live=True)  # time moves on
    assert watch.idle_check() == []  # GPU-1 10 min + GPU-2 2 h: exactly at, not over
    watch.on_balance(balance.budget, T0_US + 2 * HOUR_US + 1_000, live=True)
    (alert,) = watch.idle_check()
    assert (alert.team, alert.day_start_us, alert.idle_gpu_ms) == ("vision", T0_US, 7_800_001)
    assert watch.idle_check() == []


def orjson_dumps(doc: object) -> bytes:
    import orjson

    return orjson.dumps(doc)


def test_job_alert_watch_reopens_from_the_topic():
    watch = JobAlertWatch()
    alert = _job(FleetKind.JOB_IDLE)
    watch.observe(alert)
    assert watch.tick(alert.at_us, [], {}, [], running=()) == [
        JobAlert(
            FleetKind.JOB_IDLE_RESOLVED,
            "job-9",
            "vision",
            "train",
            T0_US,
            alert.at_us,
            HOUR_US,
            4,
            2,
            "it no longer holds them",
        )
    ]
    watch.observe(alert)
    watch.observe(_job(FleetKind.JOB_IDLE_RESOLVED))
    assert watch.tick(alert.at_us, [], {}, [], running=()) == []


def _rig(tmp_path, **rules: object) -> Rig:
    data = config_data(tmp_path)
    data["alerts"] = {"rules": rules}
    del data["queues"][1]["max_runtime_hours"]  # train: runs as long as it likes
    rig = Rig(tmp_path, data)
    rig.service = SchedulerService(rig.dispatcher, rig.publisher, alert_publisher=rig.publisher)
    return rig


def _job_alerts(rig: Rig) -> list[JobAlert]:
    found = [decode_any_alert(value) for _, value in rig.publisher.alert_messages]
    assert all(isinstance(a, JobAlert) for a in found)
    return [a for a in found if isinstance(a, JobAlert)]


def test_the_scheduler_reports_a_job_pending_too_long_and_its_end(tmp_path):
    rig = _rig(tmp_path, pending={"queues": {"dev": 5}})

    async def scenario() -> None:
        record = await rig.submit(gpus=5)  # more than the fleet has: it waits
        await rig.ticks(1)
        assert _job_alerts(rig) == []
        rig.clock.advance(6 * MINUTE_US)
        await rig.ticks(2)
        (pending,) = _job_alerts(rig)
        assert (pending.kind, pending.job, pending.queue, pending.limit_us) == (
            FleetKind.JOB_PENDING,
            record.job_id,
            "dev",
            5 * MINUTE_US,
        )
        assert pending.reason == "no_matching_gpus" and pending.gpus == 5
        await rig.service.cancel(record.job_id, None)
        await rig.ticks(1)
        _, resolved = _job_alerts(rig)
        assert resolved.kind is FleetKind.JOB_PENDING_RESOLVED
        assert resolved.reason == "ended without running" and resolved.since_us == pending.since_us

    asyncio.run(scenario())


def test_the_scheduler_reports_a_job_idle_past_its_queues_allowance(tmp_path):
    rig = _rig(tmp_path)  # the train queue alerts after 60 idle minutes (its class default)

    async def scenario() -> None:
        record = await rig.submit(queue="train", gpus=1)
        rig.executor.script(record.job_id, RUNS_FOREVER)
        await rig.ticks(2)
        job = rig.dispatcher.state.running_job(record.job_id)
        assert job is not None
        gpu = job.gpus[0].uuid
        rig.dispatcher.on_alert(idle_alert(gpu, rig.clock.now_us(), record.job_id))
        rig.clock.advance(30 * MINUTE_US)
        await rig.ticks(1)
        assert _job_alerts(rig) == []
        rig.clock.advance(31 * MINUTE_US)
        await rig.ticks(1)
        (idle,) = _job_alerts(rig)
        assert (idle.kind, idle.job, idle.idle_gpus, idle.gpus, idle.limit_us) == (
            FleetKind.JOB_IDLE,
            record.job_id,
            1,
            1,
            60 * MINUTE_US,
        )
        resolved = idle_alert(gpu, idle.since_us, record.job_id, AlertKind.RESOLVED)
        rig.dispatcher.on_alert(resolved)
        await rig.ticks(1)
        _, done = _job_alerts(rig)
        assert (done.kind, done.reason) == (
            FleetKind.JOB_IDLE_RESOLVED,
            "its GPUs are busy again",
        )

    asyncio.run(scenario())
