"""`tally up`: the whole stack from one command, and Ctrl-C stops everything it started."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request

import pytest
import yaml

from ledger.read.queries import LedgerQueries
from tally.broker import free_port
from tests.conftest import child_env, tally_command, write_config
from tests.integration.support import pipeline_config, wait_until

pytestmark = pytest.mark.broker


def _descendants(pid: int) -> set[int]:
    children: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            children.add(int(entry))
    return children | {d for c in children for d in _descendants(c)}


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def _api_ok(url: str, token: str) -> bool:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def _live_gpus(url: str, token: str) -> int:
    """How many GPUs the scheduler's inventory holds as live (0 while it cannot answer)."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=2) as response:
            gpus = json.loads(response.read())["gpus"]
    except OSError:
        return 0
    return sum(g["status"] == "live" for g in gpus)


def _jobs(url: str, token: str) -> int:
    """How many jobs the scheduler lists that the live submitter sent, not the history (0
    while it cannot answer)."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=2) as response:
            jobs = json.loads(response.read())["jobs"]
    except OSError:
        return 0
    return sum(not j["job_id"].startswith("sim-") for j in jobs)


def test_up_runs_the_stack_and_ctrl_c_stops_every_process(tmp_path):
    port = free_port()
    scheduler_port = free_port()
    tokens = tmp_path / "scheduler" / "tokens.yaml"
    data = pipeline_config(tmp_path, nodes=1)
    data["broker"] = {"mode": "embedded"}
    data["fleet"].update({"backfill_hours": 1, "pack_rounds": 30})
    # a simulated cluster: a day of history, then jobs submitted through the API
    data["fleet"]["workload"] = {"jobs_per_hour": 30, "history_days": 1, "history_interval_s": 900}
    data["quotas"] = [
        {"team": "vision", "pool": "h100", "model": "H100", "nominal": 8},
        {"team": "search", "pool": "a100", "model": "A100", "nominal": 8},
    ]
    data["dashboard"] = {"port": port}
    data["queues"] = [
        {"name": "dev", "class": "dev"},
        {"name": "training", "class": "training"},
        {"name": "inference", "class": "inference"},
    ]
    data["scheduler"] = {
        "port": scheduler_port,
        "work_dir": str(tmp_path / "scheduler"),
        "tokens": {"file": str(tokens)},
    }
    path = write_config(tmp_path / "tally.yaml", data)
    log = (tmp_path / "up.log").open("wb")
    since = time.time_ns() // 1_000
    proc = subprocess.Popen(
        tally_command("up", "--config", str(path)),
        stdout=log,
        stderr=subprocess.STDOUT,
        env=child_env(),
        cwd=tmp_path,
    )
    started = set()
    try:
        ledger = tmp_path / "ledger"
        wait_until(
            lambda: (tmp_path / "up.log").read_text().count("Tally is up") == 1, 60, "the banner"
        )
        started = _descendants(proc.pid)
        assert len(started) >= 6  # broker, worker, collector, scheduler, workload, dashboard
        banner = (tmp_path / "up.log").read_text()
        assert f"scheduler   http://127.0.0.1:{scheduler_port}" in banner
        assert "backfilling 1 days of the simulated cluster's history" in banner
        assert tokens.stat().st_mode & 0o777 == 0o600  # created with fresh tokens
        admin = yaml.safe_load(tokens.read_text())["admin"]
        wait_until(
            lambda: _api_ok(f"http://127.0.0.1:{scheduler_port}/v1/queues", admin),
            60,
            "the scheduler API to answer",
        )

        def teams_have_cost() -> bool:
            rows = LedgerQueries(ledger).cost_by(["team"])
            return len(rows) >= 2 and all(r.money_micros > 0 for r in rows)

        wait_until(teams_have_cost, 60, "cost by team within a minute")
        history = LedgerQueries(ledger).cost_by(["job_id"])
        assert any(str(r.keys[0]).startswith("sim-") for r in history)  # the history's jobs
        wait_until(  # the in-flight jobs, submitted by the workload child as their teams
            lambda: _jobs(f"http://127.0.0.1:{scheduler_port}/v1/jobs?since={since}", admin) >= 1,
            60,
            "the workload child to submit jobs",
        )
        wait_until(  # the simulated collector reports its fleet: 2 pools × 1 node × 8 GPUs
            lambda: _live_gpus(f"http://127.0.0.1:{scheduler_port}/v1/inventory", admin) == 16,
            60,
            "the scheduler to see the simulated fleet in the inventory",
        )
        wait_until(
            lambda: _http_ok(f"http://127.0.0.1:{port}/_stcore/health"),
            60,
            "the dashboard to answer",
        )
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(60)
        log.close()
    output = (tmp_path / "up.log").read_text()
    assert code == 0, output
    assert "stopped every process the stack started" in output
    time.sleep(0.5)
    still_running = {pid for pid in started if _alive(pid)}
    assert not still_running, output
