"""Helpers for the end-to-end tests of a sharded ledger (`ledger.sharded: true`): a sharded
worker's configuration, which shards a worker's log says it holds, and the union of the shards
as a reader pulls it from the segments store."""

from __future__ import annotations

import re
from pathlib import Path

from ledger.read.queries import LedgerQueries
from ledger.store.objects import LocalObjectStore
from ledger.store.replica import pull
from ledger.store.union import shard_heads
from tests.integration.support import WorkerProcess, pipeline_config


def sharded_config(
    tmp: Path,
    name: str,
    store: Path,
    seal_interval_s: float = 0.5,
    session_timeout_s: float = 3,
    nodes: int = 2,
    partitions: int = 4,
) -> dict:
    data = pipeline_config(
        tmp / name,
        nodes,
        partitions,
        sharded=True,
        segments_url=f"file://{store}",
        seal_interval_s=seal_interval_s,
    )
    data["broker"]["consumer"] = {
        "session_timeout_s": session_timeout_s,
        "heartbeat_interval_s": session_timeout_s / 6,
    }
    return data


def holding(worker: WorkerProcess) -> list[str]:
    """The worker's log lines saying which samples shards it holds, one per rebalance."""
    return re.findall(r"holding shards .*samples-.*", worker.log.read_text(errors="replace"))


def held_now(worker: WorkerProcess) -> set[str]:
    """The shards the worker's latest `holding` line names (none before its first)."""
    lines = holding(worker)
    return set(lines[-1].removeprefix("holding shards ").split(", ")) if lines else set()


def covered(partitions: int, *workers: WorkerProcess) -> bool:
    """Whether the workers' latest `holding` lines name every samples shard between them."""
    wanted = {f"samples-{p}" for p in range(partitions)}
    return wanted <= set().union(*(held_now(w) for w in workers))


def union_of(store: Path, cache: Path) -> Path:
    return pull(LocalObjectStore(str(store)), cache)


def sealed_samples(store: Path, cache: Path) -> int:
    if not shard_heads(LocalObjectStore(str(store))):
        return 0
    return LedgerQueries(union_of(store, cache)).transaction_count()
