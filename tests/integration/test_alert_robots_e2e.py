"""End to end through a real tansu broker: alerts on the alerts topic and a team's budget on the
balances topic → `tally alerts run` (a child process) → signed DingTalk and Feishu messages at
loopback robots that verify the signatures as the vendors document (`tests.robots`)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from ledger.balances import BalanceUpdate, BudgetLine, BudgetStatus, encode_balance_update
from ledger.fleet_alerts import FleetKind, JobAlert, alert_key, encode_fleet_alert
from tally.broker import free_port
from tests.builders import a_config_dict
from tests.conftest import child_env, create_topics, tally_command, write_config
from tests.robots import Robot, start_robot, stop_robot

pytestmark = pytest.mark.broker

HOUR_US = 3_600_000_000


async def _produce(bootstrap: str, records: list[tuple[str, bytes, bytes]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for topic, key, value in records:
            await producer.send_and_wait(topic, value, key=key)
    finally:
        await producer.stop()


def _texts(robot: Robot) -> list[str]:
    if robot.vendor == "dingtalk":
        return [m["markdown"]["text"] for m in robot.messages]
    return [m["content"]["text"] for m in robot.messages]


def test_alerts_and_budgets_on_the_topics_reach_signed_robots(broker, tmp_path: Path):
    create_topics(broker.bootstrap, ["e2e.alerts", "e2e.balances"], 2)
    dingtalk = start_robot("dingtalk", secret="SEC-dingtalk-secret")
    feishu = start_robot("feishu", secret="feishu-secret")
    now = time.time_ns() // 1_000
    pending = JobAlert(
        FleetKind.JOB_PENDING,
        "job-42",
        "vision",
        "batch",
        now - 3 * HOUR_US,
        now,
        HOUR_US,
        8,
        reason="no_capacity",
    )
    budget = BalanceUpdate(
        account="budget:vision",
        seq=1,
        as_of_us=now,
        current_period=time.strftime("%Y-%m", time.gmtime(now // 1_000_000)),
        periods=(),
        totals=(),
        budget=BudgetStatus(
            "vision",
            time.strftime("%Y-%m", time.gmtime(now // 1_000_000)),
            (BudgetLine("gpu_ms", 100 * 3_600_000, 85 * 3_600_000, 0),),
        ),
    )
    asyncio.run(
        _produce(
            broker.bootstrap,
            [
                ("e2e.alerts", alert_key(pending), encode_fleet_alert(pending)),
                ("e2e.alerts", alert_key(pending), encode_fleet_alert(pending)),  # a resend
                ("e2e.balances", b"budget:vision", encode_balance_update(budget)),
            ],
        )
    )
    sinks = [
        {"name": "ding", "kind": "dingtalk", "url": dingtalk.url, "secret_env": "DING_SECRET"},
        {"name": "lark", "kind": "feishu", "url": feishu.url, "secret_env": "LARK_SECRET"},
    ]
    data = a_config_dict(
        broker={"mode": "external", "bootstrap_servers": [broker.bootstrap]},
        ledger={"data_dir": str(tmp_path / "data")},
        topics={"alerts": "e2e.alerts", "balances": "e2e.balances"},
        alerts={"sinks": sinks, "rules": {"budget": {"forecast": False}}},
    )
    path = write_config(tmp_path / "tally.yaml", data)
    log = tmp_path / "alerts.log"
    env = child_env(DING_SECRET="SEC-dingtalk-secret", LARK_SECRET="feishu-secret")
    port = free_port()
    with log.open("ab") as out:
        proc = subprocess.Popen(
            tally_command("alerts", "run", "--config", str(path), "--metrics-port", str(port)),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 45
        while time.monotonic() < deadline and not (
            len(dingtalk.messages) >= 3 and len(feishu.messages) >= 3
        ):
            assert proc.poll() is None, log.read_text(errors="replace")
            time.sleep(0.1)
        time.sleep(0.5)  # nothing more should come: the resend is the same alert
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as page:
            served = page.read().decode()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
        stop_robot(dingtalk)
        stop_robot(feishu)
    output = log.read_text(errors="replace")
    for robot in (dingtalk, feishu):
        assert robot.refused == [], output
        texts = _texts(robot)
        assert len(texts) == 3, (texts, output)  # the job once, the 50 % and 80 % thresholds
        assert sum("Job job-42 (team vision, queue batch)" in t for t in texts) == 1
        assert sum("budget crossed 50%" in t for t in texts) == 1
        assert sum("budget crossed 80% — 85.00 GPU-hours of 100.00 GPU-hours" in t for t in texts)
    assert all("timestamp" in m and "sign" in m for m in feishu.messages)
    # alert delivery serves its own figures, never a ledger it does not hold
    assert "tally_alert_deliveries_total" in served
    assert "tally_ledger" not in served and "tally_idle_gpus" not in served
