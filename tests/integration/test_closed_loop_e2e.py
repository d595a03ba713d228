"""The closed loop on real processes, one story over one running stack (module-scoped): a tansu
broker, `tally worker`, `tally scheduler run` with the local executor, `tally alerts run` with
a Slack sink on a loopback webhook, and `tally collect --source nvml` on the directory-driven
fake NVML (`collectors.fake_nvml_files`), which lists the **real** processes the executor
started (each job writes its own pid under the GPU its `CUDA_VISIBLE_DEVICES` names), so the
collector reads their owners from their real `/proc/<pid>/environ`.

1. A job submitted as team vision is placed on an inventory GPU; its GPU time is in
   `tally report cost --by team,project,user,job_id` under vision / detection / its user / the
   job with exactly the GPU-ms the samples' intervals give; its hold is released against the
   metered usage and vision's consumption on the `balances` topic (fair share's input) grows.
2. The job goes idle (the fake reports 0 % for its pid) → `IdleGpuDetected` on the alerts topic
   → its queue (`reclaim_after_min: 0`) reclaims it → its cost stops.
3. An XID 79 on that GPU (a fake NVML event) while another job runs there → the job is
   requeued with `gpu_unhealthy` (same attempt) and runs on the other GPU once it is free,
   never on the sick one; the alert reaches the webhook with the XID's meaning.

The tests run in order and share the stack's state (`Story`).
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import io
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from collectors.fake_nvml_files import GPUS_FILE, PROCS_DIR, XIDS_DIR
from ledger.alerts import AlertKind, decode_alert
from ledger.assignments import Holding, owners_over
from ledger.attribution import largest_remainder, physical_gpu_ms
from ledger.errors import EventError
from ledger.events import GpuSample, Owner, decode_message
from ledger.job_events import GpuAssigned, GpuReleased
from ledger.read.reports import ReportQueries, cost_report, gpu_hours
from scheduler.jobs_topic import decode_jobs_value
from scheduler.kafka import read_topic
from streams.kafka import ensure_topics
from tally.broker import EmbeddedBroker, free_port
from tests.conftest import child_env, tally_command
from tests.integration.support import (
    WorkerProcess,
    latest_balances,
    load,
    pipeline_config,
    wait_until,
)
from tests.integration.test_scheduler_e2e import ADMIN, VISION, SchedulerProcess, tally
from tests.unit.test_alerting import Receiver, _start_receiver

pytestmark = [pytest.mark.broker, pytest.mark.slow]

GPUS = ("GPU-e2e00000-0000-4000-8000-000000000000", "GPU-e2e00000-0001-4000-8000-000000000001")
BUSY_PCT = 60
LANGUAGE = "language-e2e-token-0123456789"


@dataclass
class Story:
    """The running stack and what the story has learnt so far."""

    tmp: Path
    bootstrap: str
    topics: Any
    config_path: Path
    data_dir: Path
    fake: Path
    worker: WorkerProcess
    scheduler: SchedulerProcess
    hook: Receiver
    release: Path
    jobs: dict[str, str] = field(default_factory=dict)  # role → job id
    notes: dict[str, Any] = field(default_factory=dict)

    def get(self, path: str) -> Any:
        return self.scheduler.get(path, VISION)

    def job(self, job_id: str) -> dict[str, Any]:
        return dict(self.scheduler.get(f"/v1/jobs/{job_id}", ADMIN)["job"])

    def gpus(self) -> dict[str, dict[str, Any]]:
        return {g["uuid"]: g for g in self.get("/v1/inventory")["gpus"]}

    def on(self, job_id: str) -> str:
        (uuid,) = self.job(job_id)["assigned"]["gpu_uuids"]
        return str(uuid)

    def submit(
        self, queue: str, project: str = "detection", token: str = VISION, *, register: bool = True
    ) -> str:
        """A job of one GPU that (with `register`) announces its own pid to the fake NVML as
        busy on the device it was given, then waits for the release file."""
        device = f"{self.fake / PROCS_DIR}/$CUDA_VISIBLE_DEVICES"
        announce = f"mkdir -p {device}; echo {BUSY_PCT} > {device}/$$; " if register else ""
        done_file = f"{self.tmp}/done-$TALLY_JOB_ID"
        script = (
            f"{announce}while [ ! -e {self.release} ] && [ ! -e {done_file} ]; do sleep 0.1; done"
        )
        done = tally(
            "job", "submit", "--api", self.scheduler.api, "--token", token, "-q", queue,
            "-p", project, "--gpus", "1", "--", "sh", "-c", script,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    def wait(self, predicate: Any, what: str, timeout_s: float = 30) -> None:
        wait_until(predicate, timeout_s, what, self.worker, interval_s=0.1)


def _config(tmp: Path, port: int, hook: str) -> dict[str, Any]:
    tokens = tmp / "tokens.yaml"
    teams = {"vision": VISION, "language": LANGUAGE}
    tokens.write_text(yaml.safe_dump({"admin": ADMIN, "teams": teams}))
    data = pipeline_config(tmp, nodes=1, partitions=2)
    data["sampling"] = {"interval_s": 1}
    data["inventory"] = {"stale_after_intervals": 30, "report_every_rounds": 1}
    # idle after 2 s below 5 % (the shortest the config takes is any positive minutes); the dev
    # queue reclaims at once (reclaim_after_min: 0, allowed), batch never
    data["idle"] = {"min_duration_min": 0.03, "resolve_duration_min": 0.05}
    data["quotas"] = [
        {"team": team, "pool": "a100", "model": "A100", "nominal": 8} for team in teams
    ]
    data["queues"] = [
        {"name": "dev", "class": "dev", "idle_reclaim": {"reclaim_after_min": 0}},
        {"name": "batch", "class": "training", "idle_reclaim": "never"},
    ]
    data["scheduler"] = {
        "port": port,
        "cycle_interval_s": 0.2,
        "work_dir": str(tmp / "scheduler"),
        "tokens": {"file": str(tokens), "admin_env": None},
    }
    data["alerts"] = {"sinks": [{"name": "ops", "kind": "slack", "url": hook}]}
    return data


def _spawn(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=child_env(), start_new_session=True
        )


def _stop_all(procs: dict[str, subprocess.Popen[bytes] | None]) -> dict[str, int]:
    """SIGTERM to every process group at once, then each exit code (a hung one is killed)."""
    running = {name: proc for name, proc in procs.items() if proc is not None}
    for proc in running.values():
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    codes = {}
    for name, proc in running.items():
        try:
            codes[name] = proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
    return codes


@pytest.fixture(scope="module")
def story(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Story]:
    tmp = tmp_path_factory.mktemp("loop")
    broker = EmbeddedBroker(log_path=tmp / "broker.log").start()
    hook = _start_receiver()
    fake = tmp / "nvml"
    (fake / PROCS_DIR).mkdir(parents=True)
    (fake / XIDS_DIR).mkdir()
    (fake / GPUS_FILE).write_text(json.dumps([{"uuid": u, "name": "A100"} for u in GPUS]))
    port = free_port()
    config, path = load(tmp, _config(tmp, port, hook.url))
    topics = config.topics
    asyncio.run(ensure_topics(broker.bootstrap, list(topics.all().values()), 2, topics.compacted()))
    base = ("--config", str(path), "--bootstrap", broker.bootstrap)
    worker = WorkerProcess(path, broker.bootstrap, tmp / "worker.log").start()
    collector = _spawn(
        tally_command(
            "collect", *base, "--source", "nvml", "--fake-nvml", str(fake),
            "--pool", "a100", "--node", "gpu-node-1", "--interval", "1",
        ),
        tmp / "collect.log",
    )  # fmt: skip
    alerts = _spawn(tally_command("alerts", "run", *base), tmp / "alerts.log")
    scheduler = SchedulerProcess(
        path, broker.bootstrap, tmp / "scheduler.log", f"http://127.0.0.1:{port}"
    )
    release = tmp / "release"
    try:
        scheduler.start()
        yield Story(
            tmp, broker.bootstrap, topics, path, config.ledger.data_dir, fake,
            worker, scheduler, hook, release,
        )  # fmt: skip
    finally:
        release.touch()
        codes = _stop_all(
            {
                "alerts": alerts,
                "collect": collector,
                "scheduler": scheduler.proc,
                "worker": worker.proc,
            }
        )
        hook.server.shutdown()
        broker.stop()
    assert codes == dict.fromkeys(codes, 0), codes


# ---------------------------------------------------------------------------- reading back


def _samples(story: Story, gpu: str) -> list[GpuSample]:
    """The samples of `gpu` on the samples topic, each event once (a producer may resend)."""
    consumed = asyncio.run(read_topic(story.bootstrap, story.topics.samples, "e2e-samples"))
    out: dict[str, GpuSample] = {}
    for message in consumed:
        envelopes, _ = decode_message(message.value)
        out.update((e.id, e.data) for e in envelopes if e.data.gpu_uuid == gpu)
    return sorted(out.values(), key=lambda s: s.sample_time_us)


def _timeline(story: Story, gpu: str) -> list[Holding]:
    """Who held `gpu` when, from the scheduler's `GpuAssigned`/`GpuReleased` on `jobs`."""
    consumed = asyncio.run(read_topic(story.bootstrap, story.topics.jobs, "e2e-jobs"))
    holdings: list[Holding] = []
    for message in sorted(consumed, key=lambda m: m.seq or 0):
        event = decode_jobs_value(message.value)
        if isinstance(event, GpuAssigned) and event.gpu_uuid == gpu:
            owner = Owner(event.team, event.project, event.user, event.job_id)
            holdings.append(Holding(gpu, owner, event.time_us))
        elif isinstance(event, GpuReleased) and event.gpu_uuid == gpu:
            holdings = [
                Holding(gpu, h.owner, h.from_us, event.time_us)
                if h.owner.job_id == event.job_id and h.to_us is None
                else h
                for h in holdings
            ]
    return holdings


def expected_gpu_ms(samples: list[GpuSample], timeline: list[Holding], job: str) -> int:
    """The job's GPU-ms from the samples' intervals: a sample listing only the job's process
    is the job's whole; one listing no process is split by who held the GPU over it (largest
    remainder, by duration, nobody last); one listing another job's process is not the job's."""
    total = 0
    for sample in samples:
        ms = physical_gpu_ms(sample)
        if sample.processes:
            owners = {p.owner.job_id if p.owner else None for p in sample.processes}
            total += ms if owners == {job} else 0
            continue
        held: dict[str | None, int] = {}
        for piece in owners_over(timeline, sample.start_us, sample.sample_time_us):
            key = piece.owner.job_id if piece.owner else None
            held[key] = held.get(key, 0) + piece.end_us - piece.start_us
        if job not in held:
            continue
        keys = sorted(held, key=lambda k: k is None)
        parts = largest_remainder(ms, [held[k] for k in keys])
        total += parts[keys.index(job)]
    return total


def _explain(samples: list[GpuSample], timeline: list[Holding], job: str) -> str:
    """Each sample's interval, processes' jobs and share for the job (for a failure)."""
    lines = [f"holdings: {timeline}"]
    for sample in samples:
        jobs = [p.owner.job_id if p.owner else None for p in sample.processes]
        share = expected_gpu_ms([sample], timeline, job)
        lines.append(f"{sample.start_us}..{sample.sample_time_us} {jobs} → {share}")
    return "\n".join(lines)


def _cost_by_job(story: Story) -> dict[str, tuple[str, str, str, int]]:
    """(team, project, user, GPU-ms) per job in the sealed ledger, as `tally report cost` reads
    it (`ledger.read.reports.cost_report`)."""
    queries = ReportQueries(story.data_dir)
    try:
        report = cost_report(queries, ("team", "project", "user", "job_id"))
    finally:
        queries.close()
    return {
        str(line.keys[3]): (str(line.keys[0]), str(line.keys[1]), str(line.keys[2]), line.gpu_ms)
        for line in report.lines
        if line.keys[3] is not None and not line.unallocated
    }


def _cost_rows(story: Story) -> list[dict[str, str]]:
    """`tally report cost --by team,project,user,job_id -o csv`, as rows."""
    done = tally(
        "report", "cost", "--config", str(story.config_path),
        "--by", "team,project,user,job_id", "-o", "csv",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return list(csv.DictReader(io.StringIO(done.stdout)))


def _vision_consumed(story: Story) -> int:
    latest = latest_balances(story.bootstrap, story.topics.balances, timeout_ms=300)
    usage = latest.get("consumer:vision/detection")
    return 0 if usage is None else int(dict(usage.totals).get("gpu_ms", 0))


# ---------------------------------------------------------------------------- the story


def test_a_job_is_charged_to_its_team_from_its_real_process(story: Story) -> None:
    story.wait(lambda: set(story.gpus()) == set(GPUS), "the collector's two GPUs", 60)
    job = story.submit("dev")
    story.jobs["first"] = job
    story.wait(lambda: story.job(job)["state"] == "running", "the job to run")
    gpu = story.on(job)
    story.notes["gpu"] = gpu
    # another team's job, never reclaimed, holds the other GPU for the whole story
    filler = story.submit("batch", "pretraining", LANGUAGE, register=False)
    story.jobs["filler"] = filler
    story.wait(lambda: story.job(filler)["state"] == "running", "the filler to run")
    assert story.on(filler) != gpu
    story.wait(lambda: any(story.fake.glob(f"{PROCS_DIR}/*/*")), "the job to announce its pid")
    (pid_file,) = story.fake.glob(f"{PROCS_DIR}/*/*")
    story.notes["pid_file"] = pid_file
    environ = Path(f"/proc/{pid_file.name}/environ").read_bytes()
    assert f"TALLY_JOB_ID={job}".encode() in environ.split(b"\0")

    def metered() -> bool:
        return any(
            p.owner is not None and p.owner.job_id == job and p.sm_util_pct == BUSY_PCT
            for s in _samples(story, gpu)
            for p in s.processes
        )

    story.wait(metered, "a sample naming the job's process as busy")
    story.wait(lambda: job in _cost_by_job(story), "the job's usage in the sealed ledger")
    team, project, user, _ = _cost_by_job(story)[job]
    assert (team, project) == ("vision", "detection")
    assert user == story.job(job)["user"]
    story.wait(lambda: _vision_consumed(story) > 0, "vision's consumption on balances")


def test_an_idle_job_is_reclaimed_and_its_cost_stops(story: Story) -> None:
    job, gpu = story.jobs["first"], story.notes["gpu"]
    story.notes["pid_file"].write_text("0")  # the job goes idle

    def idle_alert() -> bool:
        consumed = asyncio.run(read_topic(story.bootstrap, story.topics.alerts, "e2e-alerts"))
        for message in consumed:
            try:
                alert = decode_alert(message.value or b"")
            except EventError:
                continue  # another family of alert (health, jobs)
            if alert.kind is AlertKind.DETECTED and alert.gpu_uuid == gpu:
                return True
        return False

    story.wait(idle_alert, "IdleGpuDetected for the job's GPU")
    story.wait(lambda: story.job(job)["state"] == "reclaimed", "the dev queue to reclaim it")

    # every sample of the GPU up to its release is sealed: the job's total no longer moves
    samples_then = len(_samples(story, gpu))
    story.wait(lambda: len(_samples(story, gpu)) >= samples_then + 2, "two more samples")
    samples, timeline = _samples(story, gpu), _timeline(story, gpu)
    expected = expected_gpu_ms(samples, timeline, job)
    assert expected > 0
    with contextlib.suppress(AssertionError):
        story.wait(lambda: _cost_by_job(story)[job][3] == expected, "the exact GPU-ms", 15)
    booked = _cost_by_job(story)[job][3]
    assert booked == expected, _explain(samples, timeline, job)
    time.sleep(1.2)  # more samples of the GPU, nobody's now
    assert _cost_by_job(story)[job][3] == expected
    assert _samples(story, gpu)[-1].processes == ()
    team, project, user, _ = _cost_by_job(story)[job]
    row = {"team": team, "project": project, "user": user, "job_id": job}
    shown = [r for r in _cost_rows(story) if r["job_id"] == job]
    assert [{k: r[k] for k in row} for r in shown] == [row]
    assert shown[0]["gpu_hours"] == str(gpu_hours(expected, 3))

    def settled() -> bool:
        latest = latest_balances(story.bootstrap, story.topics.balances, timeout_ms=300)
        hold = latest.get("hold:vision")
        return hold is not None and dict(hold.totals).get("gpu_ms") == 0

    story.wait(settled, "the hold to be released")
    # what fair share reads: vision's consumption is this job's metered usage, no more
    story.wait(lambda: _vision_consumed(story) == expected, "vision's consumption to settle")


def test_an_xid_79_requeues_the_running_job_off_the_sick_gpu(story: Story) -> None:
    sick = story.notes["gpu"]
    other = next(g for g in GPUS if g != sick)
    filler = story.jobs["filler"]
    assert story.on(filler) == other  # the sick GPU is the only free one
    victim = story.submit("batch")
    story.wait(lambda: story.job(victim)["state"] == "running", "the job to run on the GPU")
    assert story.on(victim) == sick

    index = story.gpus()[sick]["index"]
    (story.fake / XIDS_DIR / "sick").write_text(f"{index} 79")
    story.wait(lambda: story.gpus()[sick]["health"] == "unhealthy", "the GPU to be unhealthy")
    story.wait(lambda: story.job(victim)["state"] == "pending", "the job to be requeued")
    explained = tally("job", "explain", "--api", story.scheduler.api, "--token", VISION, victim)
    assert f"preempted by GPU {sick}: gpu_unhealthy" in explained.stdout, explained.stdout
    assert story.job(victim)["attempt"] == 1
    time.sleep(1)  # cycles pass: the only free GPU is the sick one, and it gets nothing
    assert story.job(victim)["state"] == "pending"
    assert not story.gpus()[sick]["placeable"]

    # the filler ends: the job runs again, on the healthy GPU
    (story.tmp / f"done-{filler}").touch()
    story.wait(lambda: story.job(victim)["state"] == "running", "the job to run again")
    assert story.on(victim) == other

    story.wait(
        lambda: any(
            sick in body["text"] and "fallen off the bus" in body["text"]
            for _, body in list(story.hook.posts)
        ),
        "the XID alert at the webhook",
    )
