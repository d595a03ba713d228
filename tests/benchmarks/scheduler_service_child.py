"""The scheduler service for the end-to-end benchmark (`bench_scheduler_e2e`), in a child
process: what `tally scheduler run` runs — the jobs-topic replay, the Kafka feeds and
publisher, the HTTP API, the ticks and the local executor — on the configured (simulated) fleet,
fixed, instead of the fleet the inventory topic reports (which would need collectors and the
ledger worker running beside it). Each tick's decide step (decide → publish, without the
executor lock; its enactment follows behind it), its decide (the cycles and the executor's
news) and each enactment (planning, the executor's starts and stops in a thread, the poll that
reports them, the follow-up), and each publish call (sends and acknowledgements) are timed; the
CPU time of some parts is counted in whichever thread runs them (the executor's starts and
polls, the work store's and run files' writes; the cyclic collector's passes in wall time, on
the loop). On SIGTERM it writes those times, its peak RSS, the GIL's switch interval while it
served and its CPU time as JSON — in all, in its main thread (the event loop: the API, the
decisions, publishing) and from the moment the API serves — and, with
`TALLY_BENCH_PROFILE=PATH` in its environment, a cProfile of the main thread to PATH, timed
by that thread's CPU clock (the loop's waits, for the broker and for the GIL, are not counted;
the executor's threads are not profiled).

    python -m tests.benchmarks.scheduler_service_child CONFIG BOOTSTRAP STATS_JSON
"""

from __future__ import annotations

import asyncio
import cProfile
import gc
import json
import os
import resource
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

from ledger.job_events import JobEvent
from scheduler.api import api_server
from scheduler.executors.local import LocalExecutor
from scheduler.kafka import KafkaPublisher
from scheduler.pipeline import Pipeline
from scheduler.service import SchedulerService, run_service
from scheduler.work_store import RunFiles, Unwritten
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


def _thread_cpu(fn: Callable[..., T], key: str, into: dict[str, float]) -> Callable[..., T]:
    """`fn`, its calling thread's CPU time added to `into[key]` (from any thread)."""
    lock = threading.Lock()

    def call(*args: Any, **kwargs: Any) -> T:
        began = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            spent = time.thread_time() - began
            with lock:
                into[key] = into.get(key, 0.0) + spent

    return call


def _gc_timer(into: dict[str, float]) -> Callable[[str, dict[str, int]], None]:
    """A `gc.callbacks` entry adding each collection's time to `into["gc gen<N>"]`."""
    began: list[float] = []

    def callback(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            began[:] = [time.perf_counter()]
        elif began:
            key = f"gc gen{info['generation']}"
            into[key] = into.get(key, 0.0) + time.perf_counter() - began[0]

    return callback


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
    parts: dict[str, float] = {}  # CPU seconds of some parts, in whichever thread ran them
    LocalExecutor.start = _thread_cpu(LocalExecutor.start, "executor start", parts)  # type: ignore[method-assign]
    LocalExecutor.poll = _thread_cpu(LocalExecutor.poll, "executor poll", parts)  # type: ignore[method-assign]
    writes: list[float] = []  # one round's work store batch: written, fsynced, renamed
    plain_write = Unwritten.__call__
    timed_write = _timed(plain_write, writes)

    def write(batch: Unwritten) -> None:
        (timed_write if batch.items else plain_write)(batch)

    Unwritten.__call__ = _thread_cpu(write, "work store write", parts)  # type: ignore[method-assign]
    RunFiles.write_all = _thread_cpu(RunFiles.write_all, "run files write", parts)  # type: ignore[method-assign]
    gc.callbacks.append(_gc_timer(parts))
    tokens = load_tokens(config)
    serve = api_server(tokens, settings.api_host, settings.api_port, settings.max_body_bytes)
    profile_path = os.environ.get("TALLY_BENCH_PROFILE")  # cProfile output, when set
    profiler = cProfile.Profile(time.thread_time) if profile_path else None
    serving: list[float] = []  # the process's and the loop thread's CPU times when the API served
    switch: list[float] = []  # the GIL's switch interval while serving

    def ready() -> None:
        serving.extend((time.process_time(), time.thread_time()))
        switch.append(sys.getswitchinterval())

    try:
        if profiler is not None:
            profiler.enable()
        asyncio.run(run_service(settings, dispatcher, serve, ready=ready))
    finally:
        if profiler is not None and profile_path:
            profiler.disable()
            profiler.dump_stats(profile_path)
        usage = resource.getrusage(resource.RUSAGE_SELF)
        main_cpu_s = time.thread_time()
        cpu_s = usage.ru_utime + usage.ru_stime
        stats = {
            "decide_s": decide,
            "enact_s": enact,
            "tick_s": ticks,
            "publish_s": publishes,
            "work_write_s": writes,
            "cpu_s": cpu_s,
            "main_cpu_s": main_cpu_s,  # the event loop's thread
            "serving_cpu_s": cpu_s - serving[0] if serving else cpu_s,  # since the API served
            "serving_main_cpu_s": main_cpu_s - serving[1] if serving else main_cpu_s,
            "events": decided,
            "max_rss_kib": usage.ru_maxrss,
            "switch_interval_s": switch[0] if switch else None,
            "parts_cpu_s": parts,
        }
        Path(stats_path).write_text(json.dumps(stats))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
