"""The scheduler service for the end-to-end benchmark (`bench_scheduler_e2e`), in a child
process: what `tally scheduler run` runs — the jobs-topic replay, the Kafka feeds and
publisher, the HTTP API, the ticks and the local executor — on the configured (simulated) fleet,
fixed, instead of the fleet the inventory topic reports (which would need collectors and the
ledger worker running beside it). Each tick's decide step (decide → publish, without the
executor lock; its enactment follows behind it), its decide (the cycles and the executor's
news) and each enactment (planning, the executor's starts and stops in a thread, the poll that
reports them, the follow-up), and each publish call
(sends and acknowledgements) are timed; on SIGTERM it writes those times, its CPU time and its
peak RSS as JSON (and, with `TALLY_BENCH_PROFILE=PATH` in its environment, a cProfile of the
whole run to PATH).

    python -m tests.benchmarks.scheduler_service_child CONFIG BOOTSTRAP STATS_JSON
"""

from __future__ import annotations

import asyncio
import cProfile
import json
import os
import resource
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

from ledger.job_events import JobEvent
from scheduler.api import api_server
from scheduler.kafka import KafkaPublisher
from scheduler.pipeline import Pipeline
from scheduler.service import SchedulerService, run_service
from tally.config import load_config
from tally.scheduling import build_dispatcher, load_tokens, service_settings

T = TypeVar("T")


def _timed(fn: Callable[..., T], into: list[float]) -> Callable[..., T]:
    def call(*args: object) -> T:
        began = time.perf_counter()
        try:
            return fn(*args)
        finally:
            into.append(time.perf_counter() - began)

    return call


def _timed_async(
    fn: Callable[..., Coroutine[Any, Any, T]], into: list[float]
) -> Callable[..., Coroutine[Any, Any, T]]:
    async def call(*args: Any) -> T:
        began = time.perf_counter()
        try:
            return await fn(*args)
        finally:
            into.append(time.perf_counter() - began)

    return call


def main(argv: Sequence[str]) -> int:
    config_path, bootstrap, stats_path = argv
    config = load_config(Path(config_path))
    settings = service_settings(config, (bootstrap,))
    dispatcher = build_dispatcher(config)  # the configured fleet, fixed
    decide: list[float] = []
    enact: list[float] = []
    decided: list[int] = []
    plain_decide = dispatcher.decide

    def counted(*args: Any) -> list[JobEvent]:
        events = plain_decide(*args)
        decided.append(len(events))
        return events

    dispatcher.decide = _timed(counted, decide)  # type: ignore[method-assign]
    Pipeline.enact = _timed_async(Pipeline.enact, enact)  # type: ignore[method-assign]
    ticks: list[float] = []  # a tick's decide step: the executor's news, decide, publish
    publishes: list[float] = []  # one publish call: send, then every acknowledgement
    SchedulerService.decide = _timed_async(SchedulerService.decide, ticks)  # type: ignore[method-assign]
    KafkaPublisher.publish = _timed_async(KafkaPublisher.publish, publishes)  # type: ignore[method-assign]
    tokens = load_tokens(config)
    serve = api_server(tokens, settings.api_host, settings.api_port, settings.max_body_bytes)
    profile_path = os.environ.get("TALLY_BENCH_PROFILE")  # cProfile output, when set
    profiler = cProfile.Profile() if profile_path else None
    try:
        if profiler is not None:
            profiler.enable()
        asyncio.run(run_service(settings, dispatcher, serve))
    finally:
        if profiler is not None and profile_path:
            profiler.disable()
            profiler.dump_stats(profile_path)
        usage = resource.getrusage(resource.RUSAGE_SELF)
        stats = {
            "decide_s": decide,
            "enact_s": enact,
            "tick_s": ticks,
            "publish_s": publishes,
            "cpu_s": usage.ru_utime + usage.ru_stime,
            "events": decided,
            "max_rss_kib": usage.ru_maxrss,
        }
        Path(stats_path).write_text(json.dumps(stats))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
