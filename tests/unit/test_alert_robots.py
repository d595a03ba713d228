"""Alerts to the chat robots — DingTalk, Feishu/Lark, WeCom — against loopback robots that check
requests as their vendors document (`tests.robots`): the message formats, the signatures and
their timestamps, the vendors' error answers (HTTP 200 with a code), which of them are retried,
and the vendors' size limits."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import requests

from ledger.alerts import AlertKind, IdleAlert, decode_alert, encode_alert
from ledger.events import Owner
from ledger.fleet_alerts import BudgetAlert, FleetKind, JobAlert
from streams.alerts.chat import chat_body, dingtalk_sign, feishu_sign, fit_bytes, vendor_error
from streams.alerts.delivery_log import DeliveryLog, DeliveryState
from streams.alerts.dispatcher import AlertDispatcher
from streams.alerts.payloads import request_for
from streams.alerts.settings import SinkKind, SinkSettings
from streams.alerts.webhook import post_json
from tally.alerts_config import AlertSinkConfig
from tally.config_fields import ConfigError
from tests.builders import T0_US
from tests.robots import Robot, start_robot, stop_robot

MIN_US = 60_000_000
HOUR_US = 60 * MIN_US
SECRET = "SECd9f8e7c6b5a4-signing-secret"


@pytest.fixture
def robots() -> Iterator[list[Robot]]:
    started: list[Robot] = []
    yield started
    for robot in started:
        stop_robot(robot)


def _robot(robots: list[Robot], vendor: str, secret: str | None = SECRET) -> Robot:
    robot = start_robot(vendor, secret=secret)
    robots.append(robot)
    return robot


def _sink(robot: Robot, secret: str | None = SECRET, **kw: Any) -> SinkSettings:
    """A sink as the configuration gives it, the secret read from the environment."""
    fields: dict[str, Any] = {
        "name": robot.vendor,
        "kind": robot.vendor,
        "url": robot.url,
        "timeout_s": 2.0,
        "backoff_initial_s": 0.02,
        "backoff_max_s": 0.05,
        "resend_interval_s": 0,
    }
    environ = {}
    if secret is not None and robot.vendor != "wecom":
        fields["secret_env"] = "ROBOT_SECRET"
        environ["ROBOT_SECRET"] = secret
    return AlertSinkConfig(**(fields | kw)).settings(environ)


def _idle() -> Any:
    return decode_alert(
        encode_alert(
            IdleAlert(
                kind=AlertKind.DETECTED,
                subject="GPU-H1",
                gpu_uuid="GPU-H1",
                node="node-h1",
                pool="h100",
                model="NVIDIA H100 80GB HBM3",
                owner=Owner("vision", "segmentation", "ada", "job-7"),
                since_us=T0_US,
                at_us=T0_US + 40 * MIN_US,
                waste_gpu_ms=10 * 60_000,
                waste_micros=600_000,
            )
        )
    )


def _budget() -> BudgetAlert:
    return BudgetAlert(
        kind=FleetKind.BUDGET_THRESHOLD,
        team="vision",
        period="2026-11",
        unit="money_micros",
        granted=1_000_000_000,
        consumed=812_500_000,
        period_start_us=T0_US,
        period_end_us=T0_US + 30 * 24 * HOUR_US,
        at_us=T0_US + 20 * 24 * HOUR_US,
        threshold_pct=80,
    )


def _deliver(sink: SinkSettings, tmp_path: Any, *alerts: Any) -> DeliveryLog:
    dispatcher = AlertDispatcher([sink], tmp_path, "EUR").start()
    try:
        dispatcher.submit(alerts)
        assert dispatcher.drain(10)
    finally:
        dispatcher.stop()
    return DeliveryLog(tmp_path)


@pytest.mark.parametrize("vendor", ["dingtalk", "feishu", "wecom"])
def test_each_robot_receives_the_alert_in_its_documented_format(vendor, robots, tmp_path):
    robot = _robot(robots, vendor)
    log = _deliver(_sink(robot), tmp_path, _idle(), _budget())
    assert robot.refused == []
    first, second = robot.messages
    if vendor == "dingtalk":
        assert first["msgtype"] == "markdown"
        assert first["markdown"]["title"] == "Tally: GPU allocated but idle"
        text = first["markdown"]["text"]
        assert "**Owner**: vision/segmentation (user ada, job job-7)" in text
        budget_text = second["markdown"]["text"]
    elif vendor == "feishu":
        assert set(first) == {"timestamp", "sign", "msg_type", "content"}
        assert first["msg_type"] == "text"
        text = first["content"]["text"]
        assert "Owner: vision/segmentation (user ada, job job-7)" in text
        budget_text = second["content"]["text"]
    else:
        assert set(first) == {"msgtype", "markdown"}
        text = first["markdown"]["content"]
        budget_text = second["markdown"]["content"]
    assert "GPU GPU-H1 on node-h1 (h100, NVIDIA H100 80GB HBM3) is allocated but idle" in text
    assert "Waste so far: 0.60 EUR for 0.17 GPU-hours" in text
    assert (
        "Budget: team vision's 2026-11 budget crossed 80% — 812.50 EUR of 1,000.00 EUR used (81%)"
        in budget_text
    )
    assert log.state(vendor, _idle().id).state is DeliveryState.SENT
    log.close()


@pytest.mark.parametrize(
    ("vendor", "code"),
    [("dingtalk", 310000), ("feishu", 19021)],
    ids=["dingtalk-sign-not-match", "feishu-sign-match-fail"],
)
def test_a_wrong_secret_is_refused_by_the_robot_and_not_retried(vendor, code, robots, tmp_path):
    robot = _robot(robots, vendor)
    log = _deliver(_sink(robot, secret="not-the-secret"), tmp_path, _idle())
    assert robot.messages == [] and robot.requests == 1  # a bad signature is final
    assert [c for c, _ in robot.refused] == [code]
    entry = log.state(vendor, _idle().id)
    assert entry.state is DeliveryState.DROPPED and entry.reason == "rejected"
    log.close()


@pytest.mark.parametrize("vendor", ["dingtalk", "feishu"])
def test_a_request_signed_over_an_hour_ago_is_refused(vendor, robots):
    robot = _robot(robots, vendor)
    sink = _sink(robot)
    url, body = request_for(sink, [_idle()], "EUR", now_us=_now_us() - 2 * HOUR_US)
    with requests.Session() as session:
        outcome = post_json(session, url, body, 2.0, {}, sink.kind)
    assert not outcome.ok and not outcome.retry
    assert "error 310000" in outcome.detail or "error 19021" in outcome.detail
    url, body = request_for(sink, [_idle()], "EUR")  # signed now: accepted
    with requests.Session() as session:
        assert post_json(session, url, body, 2.0, {}, sink.kind).ok


def test_an_unsigned_robot_gets_no_timestamp_or_sign(robots, tmp_path):
    robot = _robot(robots, "dingtalk", secret=None)
    sink = _sink(robot, secret=None)
    url, _ = request_for(sink, [_idle()], "EUR")
    assert "timestamp" not in url and "sign" not in url and url == robot.url
    _deliver(sink, tmp_path, _idle()).close()
    assert len(robot.messages) == 1


@pytest.mark.parametrize(
    ("vendor", "limited", "failed"),
    [
        ("dingtalk", (130101, "send too fast, exceed 20 times per minute"), (300001, "token")),
        ("feishu", (11232, "frequency limited"), (9499, "Bad Request")),
        ("wecom", (45009, "api freq out of limit"), (93000, "invalid webhook url")),
    ],
    ids=["dingtalk", "feishu", "wecom"],
)
def test_rate_limit_codes_are_retried_and_other_codes_are_not(
    vendor, limited, failed, robots, tmp_path
):
    robot = _robot(robots, vendor)
    robot.script = [limited, limited]
    log = _deliver(_sink(robot), tmp_path, _idle())
    assert robot.requests == 3 and len(robot.messages) == 1
    assert log.state(vendor, _idle().id).state is DeliveryState.SENT
    log.close()
    robot.script = [failed]
    job = JobAlert(
        FleetKind.JOB_PENDING,
        "job-9",
        "vision",
        "batch",
        T0_US,
        T0_US + 3 * HOUR_US,
        2 * HOUR_US,
        8,
    )
    log = _deliver(_sink(robot), tmp_path, job)
    assert robot.requests == 4  # one try: the code is final
    entry = log.state(vendor, job.id)
    assert entry.state is DeliveryState.DROPPED and entry.reason == "rejected"
    log.close()


def test_wecom_with_a_wrong_key_is_refused(robots, tmp_path):
    robot = _robot(robots, "wecom")
    sink = _sink(robot, url=robot.url.replace("key=tok-123", "key=nope"))
    log = _deliver(sink, tmp_path, _idle())
    assert robot.refused == [(93000, "invalid webhook url, hint: [key]")]
    assert log.state("wecom", _idle().id).reason == "rejected"
    log.close()


@pytest.mark.parametrize(
    ("vendor", "field_of", "limit"),
    [
        ("dingtalk", lambda b: b["markdown"]["text"], 20_000),
        ("feishu", lambda b: b["content"]["text"], 18_000),
        ("wecom", lambda b: b["markdown"]["content"], 4_096),
    ],
    ids=["dingtalk-20000", "feishu-20KB-body", "wecom-4096"],
)
def test_text_over_a_vendors_limit_is_cut_to_fit_and_the_robot_takes_it(
    vendor, field_of, limit, robots
):
    robot = _robot(robots, vendor)
    huge = "告警 GPU idle " * 5_000  # multi-byte characters: the limits are in UTF-8 bytes
    body = chat_body(SinkKind(vendor), "Tally", huge, huge)
    text = field_of(body)
    assert len(text.encode()) <= limit and "[cut: 60000 chars, sha256" in text
    sink = _sink(robot)
    url, signed = request_for(sink, [_idle()], "EUR")
    signed = {k: v for k, v in signed.items() if k in ("timestamp", "sign")} | body
    with requests.Session() as session:
        assert post_json(session, url, signed, 2.0, {}, sink.kind).ok
    assert robot.refused == []


@pytest.mark.parametrize(
    ("text", "limit", "fits"),
    [("abc", 64, "abc"), ("é" * 32, 64, "é" * 32), ("x" * 100, 100, "x" * 100)],
    ids=["ascii-exact", "two-byte-exact", "hundred"],
)
def test_text_that_fits_is_left_alone(text, limit, fits):
    assert fit_bytes(text, limit) == fits


@pytest.mark.parametrize("limit", [64, 100, 4096], ids=["min", "hundred", "wecom"])
def test_cut_text_fits_in_bytes(limit):
    cut = fit_bytes("漢" * 5_000, limit)
    assert len(cut.encode()) <= limit and "[cut: 5000 chars" in cut


@pytest.mark.parametrize(
    ("kind", "answer", "error"),
    [
        (SinkKind.DINGTALK, '{"errcode":0,"errmsg":"ok"}', None),
        (
            SinkKind.DINGTALK,
            '{"errcode":310000,"errmsg":"sign not match"}',
            (310000, "sign not match"),
        ),
        (SinkKind.FEISHU, '{"code":0,"data":{},"msg":"success"}', None),
        (SinkKind.FEISHU, '{"StatusCode":0,"StatusMessage":"success"}', None),
        (
            SinkKind.FEISHU,
            '{"code":19024,"msg":"Key Words Not Found"}',
            (19024, "Key Words Not Found"),
        ),
        (
            SinkKind.WECOM,
            '{"errcode":45009,"errmsg":"api freq out of limit"}',
            (45009, "api freq out of limit"),
        ),
        (SinkKind.WECOM, "", None),
        (
            SinkKind.WECOM,
            "<html>proxy</html>",
            (-2, "not the vendor's JSON answer: <html>proxy</html>"),
        ),
    ],
    ids=["dt-ok", "dt-sign", "fs-ok", "fs-old-ok", "fs-keyword", "wc-freq", "empty", "html"],
)
def test_vendor_answers_are_read_as_documented(kind, answer, error):
    assert vendor_error(kind, answer) == error


def test_signatures_follow_the_vendors_recipes():
    # DingTalk: key = secret, message = "timestamp\nsecret"; Feishu: key = "timestamp\nsecret",
    # message empty. The two differ for the same inputs, and each is deterministic.
    assert dingtalk_sign("s", 1_700_000_000_000) == dingtalk_sign("s", 1_700_000_000_000)
    assert dingtalk_sign("s", 1) != feishu_sign("s", 1)
    assert feishu_sign("s", 1_700_000_000) != feishu_sign("s", 1_700_000_001)


@pytest.mark.parametrize(
    ("sink", "environ", "message"),
    [
        ({"kind": "wecom", "secret_env": "X"}, {}, "a wecom sink does not sign its requests"),
        ({"kind": "slack", "secret_env": "X"}, {}, "a slack sink does not sign its requests"),
        (
            {"kind": "dingtalk", "secret_env": "ROBOT_SECRET"},
            {},
            "variable ROBOT_SECRET is not set",
        ),
    ],
    ids=["wecom-has-no-signing", "slack-has-no-signing", "secret-variable-missing"],
)
def test_robot_config_is_checked(sink, environ, message):
    fields = {"name": "r", "url": "https://oapi.dingtalk.com/robot/send?access_token=t"} | sink
    with pytest.raises((ValueError, ConfigError), match=message.replace("$", r"\$")):
        AlertSinkConfig(**fields).settings(environ)


def _now_us() -> int:
    import time

    return time.time_ns() // 1_000


def test_alerts_test_command_signs_for_the_robots(robots, tmp_path, monkeypatch):
    import yaml
    from click.testing import CliRunner

    from tally.cli import cli
    from tests.builders import a_config_dict

    ding = _robot(robots, "dingtalk")
    wecom = _robot(robots, "wecom")
    sinks = [
        {"name": "ding", "kind": "dingtalk", "url": ding.url, "secret_env": "DING_SECRET"},
        {"name": "wecom", "kind": "wecom", "url": wecom.url},
        {"name": "bad", "kind": "feishu", "url": _robot(robots, "feishu").url},  # unsigned
    ]
    monkeypatch.setenv("DING_SECRET", SECRET)
    path = tmp_path / "tally.yaml"
    data = a_config_dict(ledger={"data_dir": str(tmp_path / "data")}, alerts={"sinks": sinks})
    path.write_text(yaml.safe_dump(data))
    result = CliRunner().invoke(cli, ["alerts", "test", "--config", str(path)])
    assert result.exit_code == 1, result.output
    lines = result.output.splitlines()
    assert any(line.startswith("ok      ding (dingtalk): HTTP 200") for line in lines)
    assert any(line.startswith("ok      wecom (wecom): HTTP 200") for line in lines)
    assert any(
        line.startswith("FAILED  bad (feishu): HTTP 200, error 19021: sign match fail")
        for line in lines
    )
    assert "GPU-TEST" in ding.messages[0]["markdown"]["text"]
