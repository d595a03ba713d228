"""The test harness for "an ingest over a store": what the tests that fold messages through the
real `Ingestor` share.

It owns:
- the fold a test ingests with (`FOLD`, a `ReplaySettings`, so the same value drives a rebuild
  check) and `an_ingestor`, which wires an `Ingestor` from it over a store;
- the message values of the consumed topics: `jobs_value` (a job event or a hold),
  `samples_value` (a batch of samples), `admin_value` (a batch of admin events);
- `a_store`: an in-memory or a DuckDB store by kind (`SCRATCH`: where a test that makes many
  DuckDB ledgers keeps them, in memory where there is a `/dev/shm`);
- `Ledger`: one store fed message by message, numbering each topic's offsets as a broker log
  would, and read back as balances (`account_totals`, `gpu_ms`).

Hand-written transactions committed and sealed without the ingest (for the report tests) are
`tests.ledger_builders`' concern; a random life over a simulated broker is
`tests/unit/test_ledger_stateful.py`'s (its machine builds its own ingestor and messages: see
the note there).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

import orjson

from ledger.admin import AdminEvent, admin_envelope, admin_envelope_to_dict
from ledger.balances import ShardStamp
from ledger.events import SampleEnvelope, encode_batch
from ledger.holds import HoldEvent, HoldPlaced, HoldReleased, encode_hold, hold_envelope
from ledger.ingest import ConsumedMessage, Ingestor, IngestResult, OutputTopics
from ledger.job_events import JobEvent, encode_job_event
from ledger.pricing import Price, PriceBook
from ledger.store.hot import DuckDBStore
from ledger.store.memory import MemoryStore
from ledger.store.rebuild import ReplaySettings
from ledger.units import Unit

Store = DuckDBStore | MemoryStore
StoreKind = Literal["memory", "duckdb"]
JobsItem = JobEvent | HoldEvent

PRICES = PriceBook((Price("*", 3_600_000),))  # one micro per GPU-ms: 10 s = 10_000 of each
CENTRES = {"vision": "research", "language": "research"}
FOLD = ReplaySettings(PRICES, CENTRES)  # topics as `InputTopics` names them by default
OUTPUTS = OutputTopics("alerts", "dl", None)  # no balance messages unless a test reads them
SCHEDULER = "tally://scheduler"
SCRATCH = "/dev/shm" if os.path.isdir("/dev/shm") else None  # memory, where there is some


def jobs_value(event: JobsItem) -> bytes:
    """One jobs-topic message value: a hold in its envelope, or a scheduler's job event."""
    if isinstance(event, HoldPlaced | HoldReleased):
        return encode_hold(hold_envelope(event))[1]
    return encode_job_event(event, SCHEDULER)


def samples_value(envelopes: Iterable[SampleEnvelope]) -> bytes:
    """One samples-topic message value: the envelopes as one collector batch."""
    return encode_batch(envelopes)


def admin_value(events: Iterable[AdminEvent]) -> bytes:
    """One admin-topic message value: the events, each in its envelope."""
    return orjson.dumps([admin_envelope_to_dict(admin_envelope(e)) for e in events])


def an_ingestor(
    store: Store,
    fold: ReplaySettings = FOLD,
    *,
    topics: OutputTopics | None = OUTPUTS,
    incarnation: str = "c",
    shard: ShardStamp | None = None,
) -> Ingestor:
    """The real ingest over `store`, folding as `fold` says (prices, cost centres, idle policy,
    input topics, zone, role); `topics=None`: the ingest's default output topics."""
    return Ingestor(
        store,
        incarnation,
        fold.prices,
        fold.cost_centres,
        fold.idle_policy,
        topics,
        fold.inputs,
        fold.zone,
        fold.role,
        shard,
    )


def a_store(kind: StoreKind, path: Path) -> Store:
    """A fresh in-memory store, or a DuckDB ledger at `path`."""
    return MemoryStore() if kind == "memory" else DuckDBStore(path)


class Ledger:
    """One store fed through the real ingest, a message at a time, each topic's offsets
    numbered from 0 (partition 0) as a broker log numbers them.

    Every batch is applied by a fresh `an_ingestor` over the store (nothing but the store
    carries over between batches, as after a worker restart). `strict`: a batch that dead-letters
    anything fails the test where it is fed.
    """

    def __init__(
        self,
        store: Store,
        fold: ReplaySettings = FOLD,
        *,
        topics: OutputTopics | None = OUTPUTS,
        shard: ShardStamp | None = None,
        strict: bool = False,
    ) -> None:
        self.store = store
        self.fold = fold
        self.topics = topics
        self.shard = shard
        self.strict = strict
        self.offsets: dict[str, int] = {}

    def ingestor(self) -> Ingestor:
        return an_ingestor(self.store, self.fold, topics=self.topics, shard=self.shard)

    def message(self, topic: str, value: bytes) -> ConsumedMessage:
        """`value` at the topic's next offset."""
        offset = self.offsets.get(topic, 0)
        self.offsets[topic] = offset + 1
        return ConsumedMessage(topic, 0, offset, value)

    def apply(self, messages: list[ConsumedMessage]) -> IngestResult:
        result = self.ingestor().apply(messages)
        if self.strict:
            assert not result.dead_letters, result.dead_letters
        return result

    def jobs(self, *events: JobsItem) -> IngestResult:
        """One batch of jobs-topic messages, one per event."""
        topic = self.fold.inputs.jobs
        return self.apply([self.message(topic, jobs_value(e)) for e in events])

    def samples(self, *envelopes: SampleEnvelope, topic: str = "tally.samples") -> IngestResult:
        """One batch of one samples message holding `envelopes`."""
        return self.apply([self.message(topic, samples_value(envelopes))])

    def admin(self, *events: AdminEvent) -> IngestResult:
        """One batch of one admin message holding `events`."""
        return self.apply([self.message(self.fold.inputs.admin, admin_value(events))])

    def feed(self, topic: str, items: Iterable[object]) -> IngestResult:
        """`items` as the topic carries them: the jobs and admin topics by their verbs, any
        other topic as samples."""
        if topic == self.fold.inputs.jobs:
            return self.jobs(*items)  # type: ignore[arg-type]
        if topic == self.fold.inputs.admin:
            return self.admin(*items)  # type: ignore[arg-type]
        return self.samples(*items, topic=topic)  # type: ignore[arg-type]

    def account_totals(self) -> dict[tuple[str, str], int]:
        """Every account's balance per unit, summed over periods."""
        totals: dict[tuple[str, str], int] = {}
        for r in self.store.balance_rows():
            totals[(r.account, r.unit)] = totals.get((r.account, r.unit), 0) + r.balance
        return totals

    def gpu_ms(self) -> dict[str, int]:
        """The GPU time each account holds (over periods), the capacity accounts and the
        accounts that net to zero left out."""
        return {
            account: amount
            for (account, unit), amount in self.account_totals().items()
            if unit == Unit.GPU_MS and amount and not account.startswith("capacity:")
        }
