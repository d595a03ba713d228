"""The global shard owner's publisher of the shards' watermark (`ShardsSealedThrough`,
`ledger.admin.sealed_events`): called after each seal of the global shard, it pulls the shards
into a read cache from their heads (`ledger.store.union.shard_heads`, `pull_shards`: only new
files are fetched), computes the event from the union
(`ledger.store.sealed_usage.union_sealed_through`) and puts it on the admin topic, keyed by its
entity, when its watermark is newer than the one the global shard has folded (`known_us`). The
global shard then folds it from the topic like any admin event, so its archive holds the input
of every settlement and allowance it makes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Protocol

from ledger.admin import ShardsSealedThrough, admin_envelope, encode_admin
from ledger.store.objects import ObjectStore
from ledger.store.sealed_usage import union_sealed_through
from ledger.store.union import pull_shards, shard_heads


class AdminSender(Protocol):
    """What the publisher sends with: an aiokafka producer's `send_and_wait`."""

    async def send_and_wait(self, topic: str, value: bytes, key: bytes) -> object: ...


def read_sealed_through(
    store: ObjectStore,
    cache: Path,
    jobs: Collection[str] | None,
    samples: tuple[str, Mapping[int, int]] | None = None,
) -> ShardsSealedThrough | None:
    """The event of the shards `store` holds now, pulled into `cache` (None: no watermark);
    `samples`: the samples topic and its partitions' end offsets, read before the heads (a
    shard with no sealed usage is waited for while it has samples to seal)."""
    pull_shards(store, cache, shard_heads(store))
    return union_sealed_through(cache, jobs, samples)


async def publish_sealed_through(
    store: ObjectStore,
    cache: Path,
    sender: AdminSender,
    topic: str,
    jobs: Collection[str] | None,
    known_us: int | None,
    samples: tuple[str, Mapping[int, int]] | None = None,
) -> ShardsSealedThrough | None:
    """Publish the shards' watermark to `topic` if it advanced past `known_us` (the global
    shard's newest folded, `AdminView.sealed`); the event published, or None. `jobs`: those
    whose usage the event carries (the global shard's open holds; None: every job);
    `samples`: as `read_sealed_through`'s."""
    event = await asyncio.to_thread(read_sealed_through, store, cache, jobs, samples)
    if event is None or (known_us is not None and event.through_us <= known_us):
        return None
    key, value = encode_admin(admin_envelope(event))
    await sender.send_and_wait(topic, value, key=key)
    return event
