"""Ingest scale-out: the same samples ingested by 1, 2 and 3 `tally worker` processes in one
consumer group with `ledger.sharded: true` (a 6-partition samples topic, the shards on a local
segments store), each count on a fresh broker.

The samples are generated once, packed as the collector backfills (30 rounds per message per
GPU), and sent raw to each broker only after the group has settled (every worker holds its
shards), so no rebalance falls inside the measurement. A run is timed from the first message
sent to the commit that brings the samples committed to the total (the timestamp of the
workers' own `batch committed` log line); the workers are then stopped (each seals at stop) and
the union pulled must hold every sample once. On a 2-core machine N workers cannot get N times
the CPU of one: a ratio above 1 says how much of one worker's time was waiting rather than
computing (fetch round trips, its shards applied one after another, seals, the broker), time
that another worker fills; a ratio at or below 1 would mean one worker already kept the cores
busy."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import tempfile
import time
from datetime import datetime
from pathlib import Path

from tests.benchmarks.harness import Figure, Progress

SAMPLES = int(os.environ.get("TALLY_BENCH_SCALE_SAMPLES", "240000"))
PARTITIONS = 6
NODES = 4  # per pool: 64 GPUs
PACK = 30  # rounds per message per GPU
WORKER_COUNTS = (1, 2, 3)
SEAL_INTERVAL_S = 5.0
COMMITTED = re.compile(r"^(\S+ \S+) worker INFO tally\.worker: batch committed: .*? (\d+) samples,")


def _messages(config: object, samples: int) -> tuple[list[tuple[bytes, bytes]], int]:
    """The packed messages (key, value) of at least `samples` samples of the config's fleet
    (whole rounds), and how many samples they hold."""
    from collectors.runner import source_name
    from ledger.events import encode_batch, envelope_for
    from tests.builders import T0_US
    from tests.integration.support import fleet_of

    fleet = fleet_of(config)  # type: ignore[arg-type]
    total_rounds = -(-samples // len(fleet.gpus))
    messages: list[tuple[bytes, bytes]] = []
    for first in range(0, total_rounds, PACK):
        per_gpu: dict[str, list] = {}
        for r in range(first, min(first + PACK, total_rounds)):
            for s in fleet.sample_round(T0_US + r * fleet.interval_us):
                per_gpu.setdefault(s.gpu_uuid, []).append(envelope_for(s, source_name(s.node)))
        messages += [(gpu.encode(), encode_batch(envs)) for gpu, envs in per_gpu.items()]
    return messages, total_rounds * len(fleet.gpus)


async def _send(bootstrap: str, topic: str, messages: list[tuple[bytes, bytes]]) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks=1, linger_ms=5)
    await producer.start()
    try:
        sent = [await producer.send(topic, value, key=key) for key, value in messages]
        await asyncio.gather(*sent)
    finally:
        await producer.stop()


def _committed(logs: list[Path]) -> tuple[int, float | None]:
    """Samples committed over the workers' logs, and the last commit's time."""
    total, last = 0, None
    for log in logs:
        for line in log.read_text(errors="replace").splitlines():
            match = COMMITTED.match(line)
            if not match:
                continue
            at = datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            total += int(match[2])
            last = at if last is None else max(last, at)
    return total, last


def _ingest(
    workers: int, messages: list[tuple[bytes, bytes]], samples: int, progress: Progress
) -> float:
    """Samples/s of `workers` sharded workers ingesting `messages` on a fresh broker."""
    from tally.broker import EmbeddedBroker
    from tests.conftest import create_topics
    from tests.integration.sharded_support import covered, holding, sharded_config, union_of
    from tests.integration.support import WorkerProcess, load, wait_until

    tmp = Path(tempfile.mkdtemp(prefix=f"bench-scale-{workers}-"))
    store = tmp / "store"
    store.mkdir()
    with EmbeddedBroker(log_path=tmp / "broker.log") as broker:
        procs = []
        for n in range(workers):
            (tmp / f"w{n}-config").mkdir()
            data = sharded_config(
                tmp, f"w{n}", store, SEAL_INTERVAL_S, nodes=NODES, partitions=PARTITIONS
            )
            # batches as the ingest bench takes them
            data["worker"] = {"batch_max_messages": 2000, "batch_within_s": 0.05}
            config, path = load(tmp / f"w{n}-config", data)
            procs.append(WorkerProcess(path, broker.bootstrap, tmp / f"w{n}.log"))
        create_topics(broker.bootstrap, list(config.topics.all().values()), PARTITIONS)
        try:
            for w in procs:
                w.start()
            wait_until(
                lambda: all(holding(w) for w in procs) and covered(PARTITIONS, *procs),
                120,
                "the group to settle",
                procs[0],
            )
            progress(f"{workers} worker(s): group settled, sending {samples:,} samples")
            sent_at = time.time()  # the clock of the workers' log lines
            asyncio.run(_send(broker.bootstrap, config.topics.samples, messages))
            logs = [w.log for w in procs]
            wait_until(lambda: _committed(logs)[0] >= samples, 600, "the ingest", procs[0], 0.5)
            total, last = _committed(logs)
            assert last is not None
        finally:  # all at once: each seals its shards at stop, and none takes another's up
            for w in procs:
                if w.proc is not None and w.proc.poll() is None:
                    os.killpg(w.proc.pid, signal.SIGTERM)
            for w in procs:  # one SIGTERM each: a second one ends the clean stop early
                if w.proc is not None:
                    w.proc.wait(120)
        from ledger.read.queries import LedgerQueries

        sealed = LedgerQueries(union_of(store, tmp / "union")).transaction_count()
        if sealed != samples or total != samples:
            raise RuntimeError(f"{workers} workers: {total} committed, {sealed} sealed")
    shutil.rmtree(tmp, ignore_errors=True)
    rate = samples / max(last - sent_at, 1e-3)
    progress(f"{workers} worker(s): {rate:,.0f} samples/s")
    return rate


def run(progress: Progress) -> list[Figure]:
    from tests.integration.sharded_support import sharded_config
    from tests.integration.support import load

    tmp = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    config, _ = load(tmp, sharded_config(tmp, "gen", tmp, nodes=NODES, partitions=PARTITIONS))
    started = time.perf_counter()
    messages, samples = _messages(config, SAMPLES)
    shutil.rmtree(tmp, ignore_errors=True)
    took = time.perf_counter() - started
    progress(f"{samples:,} samples in {len(messages):,} messages, generated in {took:.0f} s")
    rates = {}
    for i, workers in enumerate(WORKER_COUNTS, 1):
        progress(f"[{i}/{len(WORKER_COUNTS)}] {workers} sharded worker(s)")
        rates[workers] = _ingest(workers, messages, samples, progress)
    note = (
        f"{os.cpu_count()} cores: N workers cannot have N× one's CPU; a ratio above 1 is time "
        "one worker spent waiting (fetch, serial shard applies, seals, broker), not computing"
    )
    return [
        Figure(
            "scale-out",
            f"{workers} sharded worker{'s' if workers > 1 else ''}",
            rates[workers],
            "samples/s",
            "1 worker" if workers > 1 else None,
            rates[1] if workers > 1 else None,
            note=note if workers == 2 else None,
        )
        for workers in WORKER_COUNTS
    ]
