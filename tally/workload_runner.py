"""The simulated cluster's live submitter: `tally up` runs it as the `workload` child when the
config has `fleet.workload`.

It follows the submit schedule (`collectors.workload.hour_jobs`, the same seed and mix the
history used): at start, the jobs the schedule has in flight (`collectors.workload.in_flight`:
the history left them out) with what is left of their runtime; then each job when its time
comes. A job is submitted through the scheduler's HTTP API (`POST /v1/jobs`) as its team, with
the team's token from the tokens file `tally up` created (or the environment). The command is
a stand-in: `sleep` for the job's runtime; the simulated collector meters the GPUs the
scheduler gave it with its queue's profile. Each submission carries its schedule key as the
idempotency key, so a restarted runner does not submit a job twice (the scheduler answers a
resent key with the job it made, or refuses it if the body changed). A refused or failed
submission is logged and skipped.

    python -m tally.workload_runner --config FILE [--log-level L] [--log-format F]
"""

from __future__ import annotations

import argparse
import logging
import math
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import requests

from collectors.simulated import HOUR_US
from collectors.workload import MINUTE_US, PlannedJob, hour_jobs, in_flight, submit_schedule
from tally.cli.logs import configure_logging
from tally.config import TallyConfig, load_config
from tally.history import job_mix, team_pools
from tally.scheduling import api_url, load_tokens

log = logging.getLogger("tally.workload")
TIMEOUT_S = 10.0
MAX_RUNTIME_US = 8 * HOUR_US  # the longest job the schedule plans


def submit_body(job: PlannedJob) -> dict[str, Any]:
    """The `POST /v1/jobs` body of a planned job (its team comes from the token)."""
    seconds = job.runtime_us // 1_000_000
    return {
        "queue": job.queue,
        "gpus": job.gpus,
        "project": job.project,
        "user": job.user,
        "pool": job.pool,
        "model": job.model,
        "estimated_runtime_s": seconds,
        "command": ["sleep", str(seconds)],
    }


def submit(base: str, token: str, job: PlannedJob) -> str:
    """Submit `job`; its job id (raises `requests.RequestException` or `RuntimeError`)."""
    response = requests.post(
        f"{base}/v1/jobs",
        json=submit_body(job),
        headers={"Authorization": f"Bearer {token}", "Idempotency-Key": job.key},
        timeout=TIMEOUT_S,
    )
    if response.status_code >= 400:
        raise RuntimeError(f"{response.status_code}: {response.text[:300]}")
    return str(response.json()["job"]["job_id"])


def resumed(jobs: Sequence[PlannedJob], now_us: int) -> list[PlannedJob]:
    """Jobs in flight at `now_us`, submitted now with what is left of their runtime (at
    least a minute)."""
    return [
        replace(j, submit_us=now_us, runtime_us=max(MINUTE_US, j.submit_us + j.runtime_us - now_us))
        for j in jobs
    ]


def run(config: TallyConfig, stop: threading.Event) -> int:
    """Submit the schedule until `stop` is set; returns the jobs submitted."""
    workload = config.fleet.workload
    if workload is None:
        log.info("no fleet.workload in the config: nothing to submit")
        return 0
    tokens = load_tokens(config).teams
    teams = [t for t in team_pools(config) if t.team.name in tokens]
    mix = job_mix(config)
    base = api_url(config)
    now = time.time_ns() // 1_000
    seed, rate = config.fleet.seed, workload.jobs_per_hour
    earlier = submit_schedule(seed, teams, mix, rate, now - MAX_RUNTIME_US, now)
    flying = resumed(in_flight(earlier, now), now)
    log.info(
        "submitting %d jobs in flight, then about %d jobs an hour to %s", len(flying), rate, base
    )
    submitted = 0
    for job in flying:
        submitted += _submit_retrying(base, tokens[job.team], job, stop)
    hour = now // HOUR_US * HOUR_US
    while not stop.is_set():
        for job in hour_jobs(seed, teams, mix, rate, hour):
            if job.submit_us < now:
                continue  # the history's, or in flight
            wait_s = (job.submit_us - time.time_ns() // 1_000) / 1e6
            if wait_s > 0 and stop.wait(wait_s):
                return submitted
            submitted += _submit_retrying(base, tokens[job.team], job, stop)
        hour += HOUR_US
        wait_s = (hour - time.time_ns() // 1_000) / 1e6
        if wait_s > 0 and stop.wait(wait_s):
            break
    return submitted


def _submit_retrying(base: str, token: str, job: PlannedJob, stop: threading.Event) -> int:
    for attempt in range(1, 6):
        try:
            job_id = submit(base, token, job)
        except (requests.RequestException, RuntimeError, KeyError, ValueError) as exc:
            log.warning("submitting %s (attempt %d) failed: %s", job.key, attempt, exc)
            if stop.wait(math.ldexp(1.0, attempt)):
                return 0
            continue
        log.info(
            "submitted %s: %s %s/%s, %d GPU(s) on %s, %d min",
            job_id,
            job.queue,
            job.team,
            job.project,
            job.gpus,
            job.pool,
            job.runtime_us // 60_000_000,
        )
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tally.workload_runner")
    parser.add_argument("--config", required=True)
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--log-format", default="text", choices=("text", "json"))
    args = parser.parse_args(argv)
    configure_logging("workload", args.log_level, args.log_format)
    config = load_config(args.config)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    submitted = run(config, stop)
    log.info("stopped after submitting %d jobs", submitted)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
