"""End-to-end scheduler benchmark: submits through the HTTP API to `JobStarted`, on loopback.

The system: a real tansu broker (`tally.broker.EmbeddedBroker`, as the `broker` test fixture
starts it), the scheduler service in a child process (`scheduler_service_child`: what
`tally scheduler run` runs, on the configured simulated fleet of `NODES` × 2 pools × 8 GPUs,
fixed), and its local executor running each job as a real process (`true`: it exits at once,
so its GPU is free again at the next tick). Load: `CLIENTS` concurrent API clients (one
aiohttp session each, teams' tokens round-robin over three teams), each submitting 1-GPU jobs
on its own schedule so that together they offer `RATE` submits/s for `LOAD_S` seconds (a client
whose answer is late sends its next submit at once; a client still behind its schedule when
the load ends leaves the slots it is behind by, and the bench counts them).

Figures: submits/s the API took over the whole load, and steady (answered between 1 s after the
load began and 1 s before it ended: the whole window's rate is biased low by the clients still
behind at its end, about API latency × rate submits), API latency p50/p99 (request sent →
answer), submit-to-start p50/p99 (request sent → the `JobStarted` on the `jobs` topic; both
clocks are this machine's wall clock), the scheduler's tick times (decide: cycles and observing
the executor; the tick step: decide and publish; enact: the executor's starts and stops and the
poll that reports them), the scheduler process's CPU time per job (from when its API served) and
its peak RSS, and the CPU time per job of every process on the path over the load's seconds
(`/proc`: the scheduler, the jobs' processes it reaped, the broker, these clients) beside how
busy the whole machine was meanwhile (other work on it included), and the jobs' processes'
CPU per job beside `true` started and reaped alone before the stack (`exec_cost_ms`: what a fake
job costs this machine whatever runs it). Baseline: the same
submit-to-start figures at `BASELINE_RATE` submits/s from as many clients (light load), run
first against the same stack.

Where the files go: the broker's log, the scheduler's work store and the jobs' logs live in a
temporary directory under `TMPDIR` (the machine's disk, as a deployment's would), and the run is
then repeated with them on a tmpfs (`/dev/shm`) when there is one and `TMPDIR` is not already
one: the executor creates a log file per job, and on this machine's virtual disk creating a file
costs 0.15–0.9 ms of CPU (about 10 µs on tmpfs), which alone decides whether two cores take the
offered rate. The second run's headline figures carry `, files on tmpfs`; each figure names the
file system its run used. Last, the run is repeated on the tmpfs (when there is one) with the
scheduler's GIL switched at Python's default 5 ms instead of the service's setting
(`scheduler.gil_switch_interval_us`, `scheduler.interpreter`): the steady rate, p99
submit-to-start and API p99 are printed beside that run's.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import astuple, dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from ledger.job_events import JobStarted
from scheduler.jobs_topic import decode_jobs_value
from scheduler.kafka import read_topic
from streams.kafka import ensure_topics
from tally.broker import EmbeddedBroker, free_port
from tally.config import parse_config
from tests.benchmarks.harness import Figure, Progress
from tests.conftest import child_env
from tests.integration.support import pipeline_config

BENCH = "scheduler e2e"
CLIENTS = 100
RATE = 1_000  # submits/s offered, all clients together
LOAD_S = 10.0
STEADY_SKIP_S = 1.0  # each edge of the load left out of the steady rate: ramp-up, the tail
BASELINE_RATE = 50
BASELINE_S = 4.0
DRAIN_S = 60.0  # at most this long after the load for every accepted job to start
NODES = 128  # per pool; two pools of 8-GPU nodes: 2,048 GPUs
TEAMS = ("vision", "language", "search")
PROJECTS = {"vision": "detection", "language": "pretraining", "search": "ranking"}
TARGET_P99_S = 2.0
EXEC_SAMPLES = 300  # fake jobs started alone, to measure what one costs the machine
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Load:
    sent_us: dict[str, int] = field(default_factory=dict)  # job → when its submit was sent
    api_s: list[float] = field(default_factory=list)
    errors: int = 0
    seconds: float = 0.0
    cpu_s: float = 0.0  # this process's CPU time while the clients ran
    statuses: Counter[int] = field(default_factory=Counter)  # answers by HTTP status
    answered_at: list[float] = field(default_factory=list)  # monotonic, each accepted submit's
    missed: int = 0  # slots the clients' schedule held before the end that they never sent
    steady: float = 0.0  # accepted submits answered per second away from the load's edges


@dataclass(frozen=True, slots=True)
class CpuSnapshot:
    """CPU seconds so far: the scheduler's own and its reaped children's (the jobs'
    processes), the broker's, this process's, and the machine's busy and total."""

    scheduler: float
    jobs: float
    broker: float
    clients: float
    busy: float
    total: float

    def __sub__(self, other: CpuSnapshot) -> CpuSnapshot:
        return CpuSnapshot(*(a - b for a, b in zip(astuple(self), astuple(other), strict=True)))


def _proc_cpu(pid: int | None) -> tuple[float, float]:
    """(own, reaped children's) CPU seconds of process `pid` (`/proc/PID/stat`: utime + stime,
    cutime + cstime); zeros when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return 0.0, 0.0
    fields = text.rsplit(")", 1)[1].split()  # from field 3 (state) on
    utime, stime, cutime, cstime = (int(f) / CLOCK_TICKS for f in fields[11:15])
    return utime + stime, cutime + cstime


def cpu_snapshot(scheduler: int | None, broker: int | None) -> CpuSnapshot:
    own, jobs = _proc_cpu(scheduler)
    with open("/proc/stat") as stat:
        ticks = [int(f) for f in stat.readline().split()[1:9]]  # user … steal
    idle = ticks[3] + ticks[4]  # idle, iowait
    return CpuSnapshot(
        scheduler=own,
        jobs=jobs,
        broker=_proc_cpu(broker)[0],
        clients=time.process_time(),
        busy=(sum(ticks) - idle) / CLOCK_TICKS,
        total=sum(ticks) / CLOCK_TICKS,
    )


def _config(tmp: Path, bootstrap: str, port: int, switch_us: int | None = None) -> Path:
    tokens = tmp / "tokens.yaml"
    tokens.write_text(yaml.safe_dump({"teams": {t: f"{t}-bench-token-0123456789" for t in TEAMS}}))
    data = pipeline_config(tmp, nodes=NODES, partitions=4)
    data["broker"] = {"mode": "external", "bootstrap_servers": [bootstrap]}
    data["quotas"] = [
        {"team": t, "pool": p, "model": m, "nominal": NODES * 8}
        for t in TEAMS
        for p, m in (("a100", "A100"), ("h100", "H100"))
    ]
    data["queues"] = [{"name": "batch", "class": "training"}]
    data["scheduler"] = {
        "port": port,
        "cycle_interval_s": 0.5,
        "work_dir": str(tmp / "scheduler"),
        "tokens": {"file": str(tokens), "admin_env": None},
    }
    if switch_us is not None:  # else the configuration's default
        data["scheduler"]["gil_switch_interval_us"] = switch_us
    path = tmp / "tally.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


async def _client(
    index: int, api: str, rate: float, until: float, load: Load, started: float
) -> None:
    team = TEAMS[index % len(TEAMS)]
    headers = {"Authorization": f"Bearer {team}-bench-token-0123456789"}
    body = {
        "project": PROJECTS[team],
        "user": "bench",
        "queue": "batch",
        "gpus": 1,
        "command": ["true"],
        "estimated_runtime_s": 60,
    }
    every = CLIENTS / rate
    next_at = started + index * every / CLIENTS
    connector = aiohttp.TCPConnector(limit=1)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        while True:
            now = time.monotonic()
            if next_at >= until or now >= until:
                # a client behind its schedule at the end leaves the slots it is behind by
                load.missed += max(0, math.ceil((until - next_at) / every))
                return
            if next_at > now:
                await asyncio.sleep(next_at - now)
            next_at += every
            sent_us = time.time_ns() // 1000
            began = time.perf_counter()
            status = 0  # no answer
            try:
                async with session.post(f"{api}/v1/jobs", json=body, headers=headers) as answer:
                    status = answer.status
                    payload = await answer.json()
                    ok = status in (201, 202)
            except (aiohttp.ClientError, TimeoutError):
                ok, payload = False, None
            load.api_s.append(time.perf_counter() - began)
            load.statuses[status] += 1
            if ok and payload is not None:
                load.sent_us[payload["job"]["job_id"]] = sent_us
                load.answered_at.append(time.monotonic())
            else:
                load.errors += 1


def steady_rate(answered_at: list[float], since: float, until: float) -> float:
    """Accepted submits answered per second between `since` and `until` (monotonic): the rate the
    system kept up with away from the load's edges, where the clients' start and their last
    answers (a client behind its schedule at the end sends no more) bias the whole window's."""
    if until <= since:
        return 0.0
    return sum(1 for t in answered_at if since <= t < until) / (until - since)


async def _load(api: str, rate: float, seconds: float) -> Load:
    load = Load()
    started = time.monotonic()
    cpu = time.process_time()
    until = started + seconds
    await asyncio.gather(*(_client(i, api, rate, until, load, started) for i in range(CLIENTS)))
    load.seconds = time.monotonic() - started
    load.steady = steady_rate(load.answered_at, started + STEADY_SKIP_S, until - STEADY_SKIP_S)
    load.cpu_s = time.process_time() - cpu
    return load


async def _healthy(api: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            try:
                async with session.get(f"{api}/v1/health") as answer:
                    if answer.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.2)
    raise RuntimeError("the scheduler API did not answer")


async def _starts(bootstrap: str, topic: str) -> dict[str, int]:
    """The first `JobStarted` time of every job on the jobs topic."""
    started: dict[str, int] = {}
    for message in await read_topic(bootstrap, topic, "bench-e2e-reader"):
        event = decode_jobs_value(message.value)
        if isinstance(event, JobStarted):
            started.setdefault(event.job_id, event.time_us)
    return started


async def _drain(bootstrap: str, topic: str, jobs: set[str], progress: Progress) -> dict[str, int]:
    deadline = time.monotonic() + DRAIN_S
    while True:
        started = await _starts(bootstrap, topic)
        left = len(jobs - set(started))
        if not left or time.monotonic() > deadline:
            if left:
                progress(f"{left} accepted jobs had not started {DRAIN_S:.0f} s after the load")
            return started
        await asyncio.sleep(2.0)


def _pct(values: list[float], q: int) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def _latencies(load: Load, started: dict[str, int]) -> list[float]:
    return [(started[j] - t) / 1e6 for j, t in load.sent_us.items() if j in started]


def exec_cost_ms(root: Path) -> float:
    """CPU milliseconds this machine spends on one fake job on its own: `true` started as the
    local executor starts it (a session of its own, descriptors closed, output appended to a
    file under `root`) and reaped, from the children's CPU time. Measured before the stack
    starts, so no other child is reaped meanwhile."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with (root / "exec-cost.log").open("ab") as log:
        for _ in range(EXEC_SAMPLES):
            subprocess.Popen(
                ["true"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            ).wait()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    used = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return 1000 * used / EXEC_SAMPLES


def _cpu_line(used: CpuSnapshot, jobs: int, seconds: float) -> str:
    """CPU per job of each process over the load, and how busy the machine was."""
    n = max(jobs, 1)
    parts = {
        "scheduler": used.scheduler,
        "jobs' processes": used.jobs,
        "broker": used.broker,
        "load clients": used.clients,
    }
    ours = sum(parts.values())
    return (
        "CPU per job over the load: "
        + ", ".join(f"{k} {1000 * v / n:.2f} ms" for k, v in parts.items())
        + f"; {1000 * ours / n:.2f} ms in all, {ours / seconds:.2f} cores of "
        f"{used.total / seconds:.1f}; the machine {100 * used.busy / max(used.total, 1e-9):.0f}% "
        "busy (other work included)"
    )


TMPFS = Path("/dev/shm")
ON_TMPFS = frozenset(
    {
        "submits/s taken",
        "submits/s taken, steady",
        "submit→start p50",
        "submit→start p99",
        "API latency p99",
        "scheduler CPU per job",
    }
)  # the figures the tmpfs run repeats
PYTHON_SWITCH_US = 5_000  # the interpreter's own GIL switch interval
VERSUS_PLAIN_SWITCH = ("submits/s taken, steady", "submit→start p99", "API latency p99")


def file_system(path: Path) -> str:
    """The type of the file system `path` is on (the longest mount point above it)."""
    best, kind = "", "unknown"
    resolved = str(path.resolve())
    with open("/proc/mounts") as mounts:
        for line in mounts:
            fields = line.split()
            point = fields[1]
            above = resolved == point or resolved.startswith(point.rstrip("/") + "/")
            if len(fields) > 2 and above and len(point) > len(best):
                best, kind = point, fields[2]
    return kind


def run(progress: Progress) -> list[Figure]:
    default = Path(tempfile.gettempdir())
    figures = _run_in(progress, default, "")
    fastest = default
    if TMPFS.is_dir() and file_system(default) != "tmpfs" and file_system(TMPFS) == "tmpfs":
        progress(f"again with the files on tmpfs ({TMPFS})")
        again = _run_in(progress, TMPFS, ", files on tmpfs")
        figures += [f for f in again if f.name.removesuffix(", files on tmpfs") in ON_TMPFS]
        fastest = TMPFS
    progress(f"again with the GIL switched every {PYTHON_SWITCH_US / 1000:g} ms (Python's default)")
    suffix = ", Python's GIL switch"
    plain = _run_in(progress, fastest, suffix, PYTHON_SWITCH_US)
    return figures + _switch_figures(figures, plain, suffix)


def _switch_figures(ours: list[Figure], plain: list[Figure], suffix: str) -> list[Figure]:
    """The last run's `VERSUS_PLAIN_SWITCH` figures beside the same at Python's switch interval
    (the service's `scheduler.gil_switch_interval_us` against the interpreter's default)."""
    by_name = {f.name.removesuffix(suffix): f for f in plain}
    latest = {f.name.removesuffix(", files on tmpfs"): f for f in ours}
    return [
        replace(
            latest[name],
            name=f"{latest[name].name}, vs Python's GIL switch",
            baseline_name=f"GIL switch {PYTHON_SWITCH_US / 1000:g} ms",
            baseline_value=by_name[name].value,
            target=None,
            note=f"the same load and files, the service's GIL switch interval (config "
            f"default) against Python's {PYTHON_SWITCH_US / 1000:g} ms",
        )
        for name in VERSUS_PLAIN_SWITCH
        if name in by_name and name in latest
    ]


def _run_in(
    progress: Progress, root: Path, suffix: str, switch_us: int | None = None
) -> list[Figure]:
    with tempfile.TemporaryDirectory(prefix="tally-bench-e2e-", dir=root) as name:
        tmp = Path(name)
        exec_ms = exec_cost_ms(tmp)
        broker = EmbeddedBroker(log_path=tmp / "broker.log").start()
        child: subprocess.Popen[bytes] | None = None
        try:
            port = free_port()
            path = _config(tmp, broker.bootstrap, port, switch_us)
            config = parse_config(yaml.safe_load(path.read_text()), str(path))
            topics = config.topics
            asyncio.run(
                ensure_topics(broker.bootstrap, list(topics.all().values()), 4, [topics.balances])
            )
            stats_path = tmp / "stats.json"
            argv = [
                sys.executable,
                "-m",
                "tests.benchmarks.scheduler_service_child",
                str(path),
                broker.bootstrap,
                str(stats_path),
            ]
            with (tmp / "scheduler.log").open("ab") as out:
                child = subprocess.Popen(
                    argv,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=child_env(),
                    start_new_session=True,
                )
            api = f"http://127.0.0.1:{port}"
            asyncio.run(_healthy(api, 60))
            progress(f"stack up: broker, scheduler (pid {child.pid}), {NODES * 16:,} GPUs")
            base = asyncio.run(_load(api, BASELINE_RATE, BASELINE_S))
            base_started = asyncio.run(
                _drain(broker.bootstrap, topics.jobs, set(base.sent_us), progress)
            )
            progress(f"baseline: {len(base.sent_us)} jobs at {BASELINE_RATE}/s")
            before = cpu_snapshot(child.pid, broker.pid)
            load = asyncio.run(_load(api, RATE, LOAD_S))
            used = cpu_snapshot(child.pid, broker.pid) - before
            progress(
                f"load: {len(load.sent_us):,} accepted, {load.errors} refused or failed in "
                f"{load.seconds:.1f} s; answers "
                + ", ".join(f"{k or 'none'}: {v:,}" for k, v in sorted(load.statuses.items()))
            )
            progress(_cpu_line(used, len(load.sent_us), load.seconds))
            accepted = set(load.sent_us)
            started = asyncio.run(_drain(broker.bootstrap, topics.jobs, accepted, progress))
        finally:
            if child is not None and child.poll() is None:
                os.killpg(child.pid, signal.SIGTERM)
                try:
                    child.wait(60)
                except subprocess.TimeoutExpired:
                    os.killpg(child.pid, signal.SIGKILL)
            broker.stop()
        stats: dict[str, Any] = json.loads(stats_path.read_text()) if stats_path.exists() else {}
        log_tail = (tmp / "scheduler.log").read_text(errors="replace")[-2000:]
    if not stats:
        raise RuntimeError(f"the scheduler wrote no statistics; its log ends:\n{log_tail}")
    figures = _figures(load, started, base, base_started, stats, progress)
    figures.append(_jobs_cpu_figure(used, len(load.sent_us), exec_ms))
    where = f"files on {file_system(root)} ({root})"
    return [
        replace(f, name=f.name + suffix, note=f"{f.note}; {where}")
        if f.name == "submits/s taken"
        else replace(f, name=f.name + suffix)
        for f in figures
    ]


def _jobs_cpu_figure(used: CpuSnapshot, jobs: int, exec_ms: float) -> Figure:
    return Figure(
        BENCH,
        "jobs' processes CPU per job",
        1000 * used.jobs / max(jobs, 1),
        "ms",
        "`true` alone",
        exec_ms,
        higher_is_better=False,
        note=f"the fake jobs the scheduler reaped over the load, beside {EXEC_SAMPLES} of them "
        "started and reaped on their own before the stack (fork, exec, exit: the machine's "
        f"cost, not Tally's); at {RATE:,} jobs/s they alone take {RATE * exec_ms / 1000:.2f} "
        f"of the {os.cpu_count() or 0} cores",
    )


def _figures(
    load: Load,
    started: dict[str, int],
    base: Load,
    base_started: dict[str, int],
    stats: dict[str, Any],
    progress: Progress,
) -> list[Figure]:
    s2s = _latencies(load, started)
    base_s2s = _latencies(base, base_started)
    decide = [1000 * s for s in stats["decide_s"]]
    enact = [1000 * s for s in stats["enact_s"]]
    tick = [1000 * s for s in stats["tick_s"]]
    publish = [1000 * s for s in stats["publish_s"]]
    rate = len(load.sent_us) / load.seconds
    rss_mib = stats["max_rss_kib"] / 1024
    progress(
        f"submit→start p50 {_pct(s2s, 50):.3f} s p99 {_pct(s2s, 99):.3f} s "
        f"({len(s2s):,} started); API p50 {_pct(load.api_s, 50) * 1000:.1f} ms p99 "
        f"{_pct(load.api_s, 99) * 1000:.1f} ms; {len(decide)} ticks, decide p50 "
        f"{_pct(decide, 50):.1f} ms p99 {_pct(decide, 99):.1f} ms, enact p50 "
        f"{_pct(enact, 50):.1f} ms p99 {_pct(enact, 99):.1f} ms, tick step p50 "
        f"{_pct(tick, 50):.1f} ms p99 {_pct(tick, 99):.1f} ms ({sum(tick) / 1000:.1f} s under "
        f"ticks in all); {len(publish)} publishes p50 {_pct(publish, 50):.1f} ms p99 "
        f"{_pct(publish, 99):.1f} ms; scheduler CPU {stats['cpu_s']:.1f} s, load clients' CPU "
        f"{load.cpu_s:.1f} s over {load.seconds:.1f} s; scheduler RSS {rss_mib:.0f} MiB"
    )
    jobs = len(load.sent_us) + len(base.sent_us)
    serving_cpu = stats.get("serving_cpu_s", stats["cpu_s"])
    main_cpu = stats.get("serving_main_cpu_s", float("nan"))
    cpu_ms = 1000 * serving_cpu / max(jobs, 1)
    progress(
        f"scheduler CPU per job {cpu_ms:.2f} ms: {serving_cpu:.2f} s since the API served, "
        f"{main_cpu:.2f} s of it in the event loop's thread, {serving_cpu - main_cpu:.2f} s in "
        f"the others (the executor's starts, writes); {jobs:,} jobs"
    )
    writes = [1000 * s for s in stats.get("work_write_s", [])]
    progress(
        f"{len(writes)} work store batches (written, fsynced, renamed before their round is "
        f"sent) p50 {_pct(writes, 50):.1f} ms p99 {_pct(writes, 99):.1f} ms, "
        f"{sum(writes) / 1000:.1f} s in all"
    )
    parts = stats.get("parts_cpu_s", {})
    progress(
        "CPU per job in parts: "
        + ", ".join(f"{k} {1000 * v / max(jobs, 1):.3f} ms" for k, v in sorted(parts.items()))
    )
    light = f"{BASELINE_RATE} submits/s"
    note = (
        f"{CLIENTS} aiohttp clients offering {RATE:,} submits/s for {LOAD_S:.0f} s through the "
        "API → tansu → scheduler (child process) → local executor (`true`) → JobStarted"
    )
    if stats.get("switch_interval_s"):
        note += f"; the scheduler's GIL switched every {1000 * stats['switch_interval_s']:g} ms"
    return [
        Figure(BENCH, "submits/s taken", rate, "submits/s", "offered", RATE, note=note),
        Figure(
            BENCH,
            "submits/s taken, steady",
            load.steady,
            "submits/s",
            "offered",
            RATE,
            note=(
                f"accepted submits answered from {STEADY_SKIP_S:g} s after the load began to "
                f"{STEADY_SKIP_S:g} s before it ended; slots the clients never sent, being behind "
                f"their schedule at the end: {load.missed:,}"
            ),
        ),
        Figure(
            BENCH,
            "submit→start p50",
            _pct(s2s, 50),
            "s",
            light,
            _pct(base_s2s, 50),
            higher_is_better=False,
        ),
        Figure(
            BENCH,
            "submit→start p99",
            _pct(s2s, 99),
            "s",
            light,
            _pct(base_s2s, 99),
            higher_is_better=False,
            target=f"< {TARGET_P99_S:.0f} s",
        ),
        Figure(
            BENCH,
            "API latency p99",
            _pct(load.api_s, 99) * 1000,
            "ms",
            light,
            _pct(base.api_s, 99) * 1000,
            higher_is_better=False,
        ),
        Figure(
            BENCH,
            "tick decide p99",
            _pct(decide, 99),
            "ms",
            "p50",
            _pct(decide, 50),
            higher_is_better=False,
            note="the whole run (baseline and load): cycles plus the executor's news",
        ),
        Figure(BENCH, "tick enact p99", _pct(enact, 99), "ms", "p50", _pct(enact, 50), False),
        Figure(
            BENCH,
            "tick step p99",
            _pct(tick, 99),
            "ms",
            "p50",
            _pct(tick, 50),
            False,
            note="decide → publish, without the executor lock (the enactment follows behind)",
        ),
        Figure(BENCH, "publish call p99", _pct(publish, 99), "ms", "p50", _pct(publish, 50), False),
        Figure(
            BENCH,
            "scheduler CPU per job",
            cpu_ms,
            "ms",
            higher_is_better=False,
            note="the scheduler process's CPU time from when its API served to its stop, "
            "over every job submitted (baseline and load)",
        ),
        Figure(BENCH, "scheduler peak RSS", rss_mib, "MiB", higher_is_better=False),
    ]
