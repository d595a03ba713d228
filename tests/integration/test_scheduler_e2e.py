"""End to end against a real tansu broker: `tally admin apply` → the ledger worker (a child
process) → the compacted `balances` topic → the scheduler service (`tally scheduler run`, a child
process) → the local executor runs a real command, on a GPU the simulated collector (a child
process) reported on the inventory topic. A job that waits with `budget_exhausted`
is admitted after a budget grant; its decisions are on the `jobs` topic in order; the ledger
books and releases its hold; `tally job explain` says why it waited; a restarted scheduler
rebuilds the job from the topic, its idempotency key included; `tally audit` shows the admin's
grants and the team's submission with who made them, and `tally ledger verify` names an audit
record altered on disk."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from ledger.holds import HoldPlaced, HoldReleased
from ledger.periods import period_label
from ledger.read.audit import audit_trail
from ledger.store.layout import SEGMENTS_DIR
from ledger.store.side_files import AUDIT_NAME, load_admin_log
from scheduler.jobs_topic import decode_jobs_value
from scheduler.kafka import read_topic
from streams.kafka import ensure_topics
from tally.broker import free_port
from tally.cli.admin import default_actor
from tests.conftest import child_env, tally_command, write_config
from tests.integration.support import (
    CollectorProcess,
    WorkerProcess,
    latest_balances,
    load,
    pipeline_config,
    wait_until,
)

pytestmark = pytest.mark.broker

VISION = "vision-e2e-token-0123456789"
ADMIN = "admin-e2e-token-0123456789"
HOLD = 2 * 3_600_000  # GPU-ms: 2 GPUs × the 1 h estimate


class SchedulerProcess:
    """`tally scheduler run` in a child process, with its log in a file."""

    def __init__(self, config_path: Path, bootstrap: str, log: Path, api: str) -> None:
        self.argv = tally_command(
            "scheduler", "run", "--config", str(config_path), "--bootstrap", bootstrap
        )
        self.log = log
        self.api = api
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> SchedulerProcess:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=child_env(),
                start_new_session=True,
            )
        wait_until(self.healthy, 60, "the scheduler API to answer")
        return self

    def healthy(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(self.log.read_text(errors="replace")[-4000:])
        try:
            return requests.get(f"{self.api}/v1/health", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def stop(self) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            raise

    def get(self, path: str, token: str = VISION) -> Any:
        response = requests.get(
            f"{self.api}{path}", headers={"Authorization": f"Bearer {token}"}, timeout=5
        )
        assert response.status_code == 200, response.text
        return response.json()


def tally(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        tally_command(*args), capture_output=True, text=True, env=child_env(), check=False
    )


def test_a_budget_grant_on_the_balances_topic_admits_a_waiting_job(broker, tmp_path):
    period = period_label(time.time_ns() // 1000)
    port = free_port()
    api = f"http://127.0.0.1:{port}"
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(yaml.safe_dump({"admin": ADMIN, "teams": {"vision": VISION}}))
    data = pipeline_config(tmp_path, nodes=1, partitions=2)
    data["budgets"] = [{"team": "vision", "period": period, "gpu_hours": "0.01"}]  # 36 GPU-s
    data["quotas"] = [{"team": "vision", "pool": "a100", "model": "A100", "nominal": 4}]
    data["queues"] = [{"name": "dev", "class": "dev"}]
    # the collector reports the fleet for two rounds and stops (its samples, nobody's, come
    # before the job's assignment); its GPUs stay placeable for a day of silence
    data["sampling"] = {"interval_s": 1}
    data["inventory"] = {"stale_after_intervals": 86_400}
    data["fleet"]["workloads"] = {"training": 0, "inference": 0, "notebook": 0, "unallocated": 1}
    data["scheduler"] = {
        "port": port,
        "cycle_interval_s": 0.2,
        "work_dir": str(tmp_path / "scheduler"),
        "tokens": {"file": str(tokens), "admin_env": None},
    }
    config, path = load(tmp_path, data)
    topics = config.topics
    asyncio.run(ensure_topics(broker.bootstrap, list(topics.all().values()), 2, [topics.balances]))
    applied = tally("admin", "apply", str(path), "--initial", "--bootstrap", broker.bootstrap)
    assert applied.returncode == 0, applied.stderr

    worker = WorkerProcess(path, broker.bootstrap, tmp_path / "worker.log").start()
    collector = CollectorProcess(path, broker.bootstrap, tmp_path / "collect.log", rounds=2)
    collector.start()
    scheduler = SchedulerProcess(path, broker.bootstrap, tmp_path / "scheduler.log", api).start()
    cli = ("--api", api, "--token", VISION)
    release = tmp_path / "release-the-job"
    try:
        wait_until(
            lambda: len(scheduler.get("/v1/inventory")["gpus"]) == 16,
            90,
            "the scheduler to read the collector's inventory",
            worker,
        )

        def budget_known() -> bool:
            (vision,) = scheduler.get("/v1/balances")["balances"]
            return vision["budgeted"] and vision["units"][0]["granted"] == 36_000

        wait_until(budget_known, 90, "the scheduler to read vision's budget", worker)

        submit = (
            "job", "submit", *cli, "-q", "dev", "-p", "detection", "--gpus", "2",
            "--estimate", "1h", "--idempotency-key", "e2e-submit-1", "--", "sh", "-c",
            f"echo devices=$CUDA_VISIBLE_DEVICES; while [ ! -e {release} ]; do sleep 0.1; done",
        )  # fmt: skip
        submitted = tally(*submit)
        assert submitted.returncode == 0, submitted.stderr
        job = submitted.stdout.strip()

        def job_state() -> dict[str, Any]:
            return dict(scheduler.get(f"/v1/jobs/{job}")["job"])

        wait_until(lambda: job_state()["reason"] == "budget_exhausted", 30, "the job to wait")
        explained = tally("job", "explain", *cli, job)
        assert explained.returncode == 0, explained.stderr
        assert "budget cannot cover" in explained.stdout, explained.stdout
        listed = tally("job", "list", *cli, "-o", "csv")
        assert f"{job},vision,dev,2,pending,budget_exhausted" in listed.stdout, listed.stdout

        # the grant: the admin log must hold the first one, so apply sends the difference
        wait_until(
            lambda: bool(load_admin_log(config.ledger.data_dir / SEGMENTS_DIR)),
            60,
            "the first grant to be sealed",
            worker,
        )
        data["budgets"][0]["gpu_hours"] = 100
        write_config(path, data)
        granted = tally("admin", "apply", str(path), "--bootstrap", broker.bootstrap)
        assert granted.returncode == 0, granted.stderr

        wait_until(lambda: job_state()["state"] == "running", 90, "the job to run", worker)

        # its hold (2 GPUs × 1 h) moves from the scheduler's count to the ledger's, once
        def counted_by_ledger() -> bool:
            (line,) = scheduler.get("/v1/balances")["balances"][0]["units"]
            return line["ledger_open_holds"] == HOLD and line["holds_not_yet_in_ledger"] == 0

        wait_until(counted_by_ledger, 60, "the ledger to count the hold", worker)
        (line,) = scheduler.get("/v1/balances")["balances"][0]["units"]
        assert line["granted"] == 100 * 3_600_000
        assert line["available_to_admit"] == line["remaining"] == line["granted"] - HOLD
        release.touch()
        wait_until(lambda: job_state()["state"] == "finished", 90, "the job to finish", worker)
        record = job_state()
        assert record["exit_code"] == 0 and record["assigned"]["pool"] == "a100"

        events = _job_events(broker.bootstrap, topics.jobs, job)
        assert _collapse(events) == [
            "JobSubmitted",
            "JobWaiting:budget_exhausted",
            "JobAdmitted",
            "HoldPlaced",
            "JobStarted",
            "JobFinished",
            "HoldReleased",
        ]
        log = (tmp_path / "scheduler" / "logs" / f"{job}.log").read_text()
        devices = sorted(log.strip().removeprefix("devices=").split(","))
        assert len(devices) == 2 and all(d.isdigit() for d in devices), log

        # the ledger booked the hold and released it: vision holds nothing
        def hold_released() -> bool:
            latest = latest_balances(broker.bootstrap, topics.balances, timeout_ms=500)
            hold = latest.get("hold:vision")
            return hold is not None and dict(hold.totals).get("gpu_ms") == 0

        wait_until(hold_released, 60, "the ledger to release the hold", worker)

        # a restarted scheduler rebuilds the job from the jobs topic
        before = tally("job", "explain", *cli, job).stdout
        assert "now: finished" in before
        assert scheduler.stop() == 0
        scheduler.start()
        assert job_state() == record
        assert tally("job", "explain", *cli, job).stdout == before
        # the submission's idempotency key came back with it: a resubmit is the same job
        again = tally(*submit)
        assert (again.returncode, again.stdout.strip()) == (0, job), again.stderr
        events = _job_events(broker.bootstrap, topics.jobs, job)
        assert [type(e).__name__ for e in events].count("JobSubmitted") == 1
        wait_until(
            lambda: any(r.entry.kind == "job.submit" for r in audit_trail(config.ledger.data_dir)),
            60,
            "the submission's audit record to be sealed",
            worker,
        )
    finally:
        code = scheduler.stop()
        collector.stop()
        assert worker.stop() == 0
    assert code == 0, (tmp_path / "scheduler.log").read_text()[-3000:]
    _check_audit(path, config.ledger.data_dir, job)


def _check_audit(path: Path, data_dir: Path, job: str) -> None:
    """`tally audit` names who granted and who submitted; an altered record fails verify."""
    shown = tally("audit", "--config", str(path), "-o", "json")
    assert shown.returncode == 0, shown.stderr
    trail = json.loads(shown.stdout)
    grants = [
        (r["actor"], r["role"], r["after"]["granted"])
        for r in trail
        if r["kind"] == "admin.budget_granted"
    ]
    assert grants == [(default_actor(), "admin", 36_000), (default_actor(), "admin", 360_000_000)]
    [submit] = [r for r in trail if r["kind"] == "job.submit"]
    assert (submit["subject"], submit["actor"], submit["client"]) == (
        job,
        "team:vision",
        "127.0.0.1",
    )
    assert tally("ledger", "verify", "--config", str(path)).returncode == 0

    audit_file = data_dir / SEGMENTS_DIR / AUDIT_NAME
    lines = audit_file.read_bytes().splitlines(keepends=True)
    record = json.loads(lines[submit["seq"] - 1])
    record["actor"] = "team:language"  # blame another team
    lines[submit["seq"] - 1] = json.dumps(record).encode() + b"\n"
    audit_file.write_bytes(b"".join(lines))
    checked = tally("ledger", "verify", "--config", str(path))
    assert checked.returncode == 1, checked.stdout
    assert (
        f"audit record {submit['seq']} (position {submit['seq']})"
        in checked.stdout + checked.stderr
    )


def _job_events(bootstrap: str, topic: str, job: str) -> list[Any]:
    consumed = asyncio.run(read_topic(bootstrap, topic, "e2e-reader"))
    events = []
    for m in sorted(consumed, key=lambda m: m.seq or 0):
        event = decode_jobs_value(m.value)
        if event is not None and getattr(event, "job_id", None) == job:
            events.append(event)
    return events


def _collapse(events: list[Any]) -> list[str]:
    """Event names, GPU events left out, a hold per unit counted once."""
    out: list[str] = []
    for event in events:
        name = type(event).__name__
        if name.startswith("Gpu"):
            continue
        if name == "JobWaiting":
            name = f"{name}:{event.reason.value}"
        if isinstance(event, HoldPlaced | HoldReleased) and out and out[-1] == name:
            continue
        out.append(name)
    return out
