"""Ingest throughput: samples already in the broker → sealed ledger rows, three pipelines on the
same data in the same run.

(a) Tally's worker (`streams.worker.LedgerWorker`: Faust `take_events` batches → attribution →
    one DuckDB transaction with offsets → sealed Parquet);
(b) the naive Faust agent most projects write: one event at a time, one INSERT per posting;
(c) a hand-written reference: aiokafka `getmany` → JSON decode → Arrow → one DuckDB insert per
    batch → Parquet — the practical ceiling on this machine.

Each pipeline runs in its own process (clean memory figures), from the first message received
to the last row written to Parquet. Two data shapes: backfill (30 rounds per message per GPU, as
the collector packs history) and real-time (one sample per message).
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from tests.benchmarks.harness import Figure, Progress

PARTITIONS = 8
ADMIN_TOPIC, JOBS_TOPIC = "bench.admin", "bench.jobs"  # empty: the worker's Faust agents
NAIVE_LIMIT = 6_000  # the naive pipeline is measured on a prefix: it is that slow


def _peak_rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _settings(bootstrap: str, topic: str, data_dir: Path, group: str) -> Any:
    from ledger.pricing import Price, PriceBook
    from ledger.store.hot_memory import BENCH_MEMORY_LIMIT
    from streams.worker import WorkerSettings

    return WorkerSettings(
        bootstrap=(bootstrap,),
        group_id=group,
        samples_topic=topic,
        deadletter_topic="bench.deadletter",
        alerts_topic="bench.alerts",
        data_dir=data_dir,
        prices=PriceBook((Price("*", 2_500_000),)),
        cost_centres={},
        batch_max_messages=2000,
        batch_within_s=0.05,
        seal_interval_s=3600,
        admin_topic=ADMIN_TOPIC,
        jobs_topic=JOBS_TOPIC,
        # an operator's bound on the writer's DuckDB memory (`ledger.duckdb_memory_limit`):
        # the bench's target is on peak RSS as much as on speed
        duckdb_memory_limit=BENCH_MEMORY_LIMIT,
    )


def run_tally(bootstrap: str, topic: str, samples: int, out: str) -> None:
    import faust

    from streams.worker import LedgerWorker

    data_dir = _data_dir(out)
    worker = LedgerWorker(_settings(bootstrap, topic, data_dir, f"bench-a-{uuid.uuid4().hex}"))
    marks: dict[str, float] = {}
    apply = worker._apply

    async def timed_apply(messages: Any) -> Any:
        marks.setdefault("first", time.perf_counter())
        return await apply(messages)

    worker._apply = timed_apply  # type: ignore[method-assign]

    @worker.app.timer(0.05)
    async def finished() -> None:
        if worker.stats.samples >= samples and "done" not in marks:
            await worker.seal()
            marks["done"] = time.perf_counter()
            rows = worker.store._con.execute("SELECT count(*) FROM source_ranges").fetchone()
            Path(out).write_text(
                json.dumps(
                    {
                        "seconds": marks["done"] - marks["first"],
                        "samples": worker.stats.samples,
                        "peak_rss_mib": _peak_rss_mib(),
                        "ranges": rows[0] if rows else 0,
                    }
                )
            )
            import os

            os._exit(0)

    faust.Worker(
        worker.app, loglevel="error", quiet=True, redirect_stdouts=False
    ).execute_from_commandline()


def run_naive(bootstrap: str, topic: str, samples: int, out: str) -> None:
    import duckdb
    import faust
    import orjson

    from ledger.attribution import attribute_sample
    from ledger.events import envelope_from_dict
    from ledger.pricing import Price, PriceBook

    data_dir = _data_dir(out)
    con = duckdb.connect(str(data_dir / "naive.duckdb"))
    con.execute(
        "CREATE TABLE postings (txn_id VARCHAR, leg INT, account VARCHAR, unit VARCHAR, "
        "amount BIGINT, team VARCHAR, project VARCHAR, start_us BIGINT, end_us BIGINT)"
    )
    prices = PriceBook((Price("*", 2_500_000),))
    app = faust.App(
        f"bench-b-{uuid.uuid4().hex}",
        broker=f"kafka://{bootstrap}",
        store="memory://",
        web_enabled=False,
        topic_allow_declare=False,
        topic_disable_leader=True,
        consumer_auto_offset_reset="earliest",
        broker_session_timeout=6.0,
        broker_heartbeat_interval=1.0,
        broker_rebalance_timeout=6.0,
        datadir=str(data_dir / "faust"),
    )
    source = app.topic(topic, key_serializer="raw", value_serializer="raw")
    state: dict[str, float] = {"n": 0}

    @app.agent(source)
    async def naive(stream: Any) -> None:
        async for value in stream:
            state.setdefault("first", time.perf_counter())
            items = orjson.loads(value)
            for item in items if isinstance(items, list) else [items]:
                txn = attribute_sample(envelope_from_dict(item), prices, {})
                for leg, p in enumerate(txn.postings):
                    con.execute(
                        "INSERT INTO postings VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        [
                            txn.txn_id,
                            leg,
                            p.account,
                            p.unit.value,
                            p.amount,
                            p.team,
                            p.project,
                            txn.start_us,
                            txn.end_us,
                        ],
                    )
                state["n"] += 1
            if state["n"] >= samples:
                con.execute(f"COPY postings TO '{data_dir / 'naive.parquet'}' (FORMAT parquet)")
                Path(out).write_text(
                    json.dumps(
                        {
                            "seconds": time.perf_counter() - state["first"],
                            "samples": state["n"],
                            "peak_rss_mib": _peak_rss_mib(),
                        }
                    )
                )
                import os

                os._exit(0)

    faust.Worker(
        app, loglevel="error", quiet=True, redirect_stdouts=False
    ).execute_from_commandline()


def run_reference(bootstrap: str, topic: str, samples: int, out: str) -> None:
    import duckdb
    import orjson
    import pyarrow as pa
    from aiokafka import AIOKafkaConsumer

    data_dir = _data_dir(out)
    con = duckdb.connect(str(data_dir / "reference.duckdb"))
    con.execute(
        "CREATE TABLE samples (id VARCHAR, gpu_uuid VARCHAR, model VARCHAR, pool VARCHAR, "
        "util INT, memory_used BIGINT, time_us BIGINT, interval_us BIGINT, team VARCHAR)"
    )

    async def main() -> dict[str, float]:
        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=bootstrap,
            group_id=f"bench-c-{uuid.uuid4().hex}",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=6000,
            heartbeat_interval_ms=1000,
            max_partition_fetch_bytes=8 << 20,
        )
        await consumer.start()
        n = 0
        first = None
        try:
            while n < samples:
                batch = await consumer.getmany(timeout_ms=1000, max_records=2000)
                if not batch:
                    continue
                first = first or time.perf_counter()
                cols: dict[str, list[Any]] = {
                    k: []
                    for k in (
                        "id",
                        "gpu_uuid",
                        "model",
                        "pool",
                        "util",
                        "memory_used",
                        "time_us",
                        "interval_us",
                        "team",
                    )
                }
                for messages in batch.values():
                    for message in messages:
                        items = orjson.loads(message.value)
                        for item in items if isinstance(items, list) else [items]:
                            d = item["data"]
                            procs = d["processes"]
                            owner = procs[0]["owner"] if procs else None
                            cols["id"].append(item["id"])
                            cols["gpu_uuid"].append(d["gpu_uuid"])
                            cols["model"].append(d["model"])
                            cols["pool"].append(d["pool"])
                            cols["util"].append(d["util_gpu_pct"])
                            cols["memory_used"].append(d["memory_used_bytes"])
                            cols["time_us"].append(d["sample_time_us"])
                            cols["interval_us"].append(d["interval_us"])
                            cols["team"].append(owner["team"] if owner else None)
                table = pa.table(cols)
                con.register("batch", table)
                con.execute("INSERT INTO samples SELECT * FROM batch")
                con.unregister("batch")
                n += table.num_rows
                await consumer.commit()
            con.execute(f"COPY samples TO '{data_dir / 'reference.parquet'}' (FORMAT parquet)")
            assert first is not None
            return {
                "seconds": time.perf_counter() - first,
                "samples": n,
                "peak_rss_mib": _peak_rss_mib(),
            }
        finally:
            await consumer.stop()

    Path(out).write_text(json.dumps(asyncio.run(main())))


def _data_dir(out: str) -> Path:
    """A pipeline's data directory, beside its result file in the run's own directory."""
    data_dir = Path(out).with_name("data")
    data_dir.mkdir()
    return data_dir


def _in_child(target: Any, *args: Any) -> dict[str, float]:
    """Run `target(*args, out)` in a child process; its result file and data live in a
    directory of their own, removed when it is read (the children end with `os._exit`)."""
    with tempfile.TemporaryDirectory(prefix="tally-bench-ingest-") as work:
        out = str(Path(work) / "result.json")
        ctx = mp.get_context("spawn")
        proc = ctx.Process(target=target, args=(*args, out))
        proc.start()
        proc.join(600)
        if proc.is_alive():
            proc.kill()
            raise RuntimeError(f"{target.__name__} did not finish in 10 minutes")
        text = Path(out).read_text() if Path(out).exists() else ""
        if not text:
            raise RuntimeError(f"{target.__name__} exited with {proc.exitcode} and no result")
        return dict(json.loads(text))


def _fill(bootstrap: str, topic: str, rounds: int, pack: int) -> int:
    from collectors.producer import SampleProducer
    from collectors.runner import source_name
    from collectors.simulated import PoolSpec, SimulatedFleet, TeamSpec, WorkloadKind
    from ledger.events import envelope_for
    from streams.kafka import ensure_topics

    fleet = SimulatedFleet(
        5,
        (PoolSpec("a100", "A100", 4, 8, 80), PoolSpec("h100", "H100", 4, 8, 80)),
        (TeamSpec("vision", ("detection",)), TeamSpec("search", ("ranking",))),
        (
            (WorkloadKind.TRAINING, 40),
            (WorkloadKind.INFERENCE, 20),
            (WorkloadKind.NOTEBOOK, 15),
            (WorkloadKind.UNALLOCATED, 25),
        ),
        10_000_000,
    )
    start = 1_793_491_200_000_000

    async def main() -> int:
        await ensure_topics(bootstrap, [topic, ADMIN_TOPIC, JOBS_TOPIC], PARTITIONS)
        producer = SampleProducer(bootstrap, topic)
        await producer.start()
        sent = 0
        try:
            for r in range(rounds):
                producer.add(
                    envelope_for(s, source_name(s.node))
                    for s in fleet.sample_round(start + (r + 1) * fleet.interval_us)
                )
                if (r + 1) % pack == 0:
                    sent += await producer.flush()
            sent += await producer.flush()
        finally:
            await producer.stop()
        return sent

    return asyncio.run(main())


def run(progress: Progress) -> list[Figure]:
    from tally.broker import EmbeddedBroker

    figures: list[Figure] = []
    shapes = (("backfill", 3_000, 30), ("real-time", 1_000, 1))  # rounds × 64 GPUs
    with EmbeddedBroker() as broker:
        for shape, rounds, pack in shapes:
            topic = f"bench.{shape}"
            samples = _fill(broker.bootstrap, topic, rounds, pack)
            progress(f"{shape}: {samples} samples in the broker, {pack} per message")
            progress(f"{shape}: (c) reference")
            c = _in_child(run_reference, broker.bootstrap, topic, samples)
            progress(f"{shape}: (a) tally worker")
            a = _in_child(run_tally, broker.bootstrap, topic, samples)
            progress(f"{shape}: (b) naive agent on the first {NAIVE_LIMIT} samples")
            b = _in_child(run_naive, broker.bootstrap, topic, min(samples, NAIVE_LIMIT))
            rate = {k: v["samples"] / v["seconds"] for k, v in (("a", a), ("b", b), ("c", c))}
            figures += [
                Figure(
                    "ingest",
                    f"{shape} a=tally",
                    rate["a"],
                    "samples/s",
                    "c=reference",
                    rate["c"],
                    target="a ≥ 0.5 × c",
                ),
                Figure(
                    "ingest",
                    f"{shape} a=tally",
                    rate["a"],
                    "samples/s",
                    "b=naive agent",
                    rate["b"],
                    target="a ≥ 20 × b",
                ),
                Figure(
                    "ingest",
                    f"{shape} worker peak",
                    a["peak_rss_mib"],
                    "MiB RSS",
                    "reference peak",
                    c["peak_rss_mib"],
                    higher_is_better=False,
                ),
            ]
    return figures


if __name__ == "__main__":  # pragma: no cover
    for f in run(lambda m: print(m, file=sys.stderr)):
        print(f)
