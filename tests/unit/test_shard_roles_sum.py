"""The shards sum to the whole (`ledger.ingest.shards`): one stream of messages — samples on three
partitions, jobs events with holds, assignments and a late owner, admin events (a team defined,
a price set, a budget grant, an adjustment, a monthly budget policy, a reversal of a usage
transaction, a period close) and garbage on every topic — applied in the same interleaved batch
order to one `WHOLE` ingestor, and to a `GLOBAL` ingestor (admin and jobs) beside one `SAMPLES`
ingestor per partition (admin, jobs and its partition's samples), each over a store of its own.

After the stream, every shard folds one more admin batch: the `ShardsSealedThrough` computed
from the samples shards (`ledger.store.sealed_usage`: their newest usage, the union's usage up
to the watermark), as the global shard's owner publishes it.

Then: the union of the shards' usage and reversals is the whole's (ids and postings), each in
one shard only; grants and adjustments are the global's and equal the whole's; the dead letters
of the samples shards (from samples) and of the global (admin and jobs) are the whole's, each
once; once every hold is released and the watermark passed their release, every account's
balance per period is the whole's, except the hold accounts, which net to zero in both and
whose postings sum per account and kind (placed, settled, released) to the whole's — a global
shard settles each hold once, at its end, from the event's usage, where the whole settles
batch by batch (so the periods the settlements are booked into may differ); the whole and
the samples shards log the event as changing nothing; a samples shard holds no holds and
publishes no balances. On the in-memory store for two batch orders and a few (Hypothesis) cuts
of the batches into smaller ones, and once on DuckDB."""

from __future__ import annotations

import tempfile
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from itertools import pairwise
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.admin import (
    AdjustmentRecorded,
    AdminEvent,
    BudgetGranted,
    BudgetPolicySet,
    Cadence,
    CarryOver,
    PeriodClosed,
    PriceSet,
    TeamDefined,
)
from ledger.events import Envelope, Owner
from ledger.holds import HoldPlaced, HoldReleased
from ledger.ingest import ConsumedMessage, Ingestor, InputTopics, OutputTopics
from ledger.ingest.admin import ELSEWHERE_OUTCOME, SEALED_ELSEWHERE
from ledger.ingest.shards import ShardRole
from ledger.job_events import GpuAssigned, JobSubmitted
from ledger.postings import Transaction, TransactionKind
from ledger.store.hot import DuckDBStore
from ledger.store.memory import MemoryStore
from ledger.store.objects import LocalObjectStore, PrefixedStore
from ledger.store.rebuild import archive_batch_count, rebuild
from ledger.store.replica import Publisher, pull
from ledger.store.schema import POSTING_COLUMNS_SQL, transaction_from_rows
from ledger.store.sealed_usage import shards_sealed_through, usage_lines, watermark
from ledger.store.union import union_shards
from ledger.store.union_rebuild import named_report, rebuild_members, role_of
from ledger.store.union_rules import GLOBAL_SHARD
from ledger.units import Unit
from tests.builders import INTERVAL_US, a_process, an_envelope, an_owner
from tests.ledger_harness import (
    FOLD,
    SCRATCH,
    JobsItem,
    Store,
    admin_value,
    an_ingestor,
    jobs_value,
    samples_value,
)
from tests.scheduler_builders import a_spec

ADMIN, JOBS, SAMPLES = "admin", "jobs", "samples"
SHARDED = replace(FOLD, inputs=InputTopics(ADMIN, JOBS))
TOPICS = OutputTopics("alerts", "dl", "balances")  # the shards publish balances
PARTITIONS = (0, 1, 2)
MODEL, POOL = "NVIDIA H100 80GB HBM3", "h100"
DEC_US = 1_796_083_200_000_000  # 2026-12-01T00:00:00Z
META = ("alice", "shards")
GARBAGE = b"{not json"
HOLD_KINDS = (TransactionKind.HOLD, TransactionKind.HOLD_SETTLE, TransactionKind.HOLD_RELEASE)
HOLD_ACCOUNTS = ("hold:", "holds-outstanding:")


def at(index: int) -> int:
    """Sample times straddle the end of November: index 6 is December's first interval."""
    return DEC_US + (index - 6) * INTERVAL_US


JOB_1 = an_owner("vision", "detection", "ada", "job-1")  # holds a hold
JOB_7 = Owner(None, None, "ada", "job-7")  # named by its job only: its owner comes late


def sample(partition: int, index: int) -> Envelope:
    """Partition 0: job-1's own GPU; 1: a GPU nobody names until its `GpuAssigned`; 2: job-7's,
    known by its job id only until its `JobSubmitted`."""
    owners = {0: (a_process(owner=JOB_1),), 1: (), 2: (a_process(owner=JOB_7),)}
    return an_envelope(
        gpu_uuid=f"GPU-p{partition}", sample_time_us=at(index), processes=owners[partition]
    )


REVERSED = sample(0, 1)  # the usage transaction the admin reverses (its id is the sample's)


def admin(*events: AdminEvent) -> tuple[str, int, bytes]:
    return (ADMIN, 0, admin_value(events))


def jobs(event: JobsItem) -> tuple[str, int, bytes]:
    return (JOBS, 0, jobs_value(event))


def samples(partition: int, *indices: int) -> tuple[str, int, bytes]:
    return (SAMPLES, partition, samples_value(sample(partition, i) for i in indices))


def hold(job: str, team: str, amount: int, index: int) -> HoldPlaced:
    return HoldPlaced(job, team, None, Unit.MONEY, amount, at(1_000), at(index))


Item = tuple[str, int, bytes]
# (topic, partition, value) in the order the broker gives them; each inner tuple is one batch
STREAM: tuple[tuple[Item, ...], ...] = (
    (
        admin(
            TeamDefined("vision", "research", ("detection",), ("ada",), *META, at(0)),
            PriceSet(MODEL, None, 7_200_000, *META, at(0)),
            BudgetGranted("vision", "2026-11", Unit.MONEY, 1_000_000, *META, at(0)),
            AdjustmentRecorded(
                "consumer:vision/detection", Unit.MONEY, 500, "2026-11", *META, at(0)
            ),
            BudgetPolicySet(
                "language",
                Unit.MONEY,
                20_000,
                Cadence.MONTH,
                None,
                None,
                CarryOver.NONE,
                None,
                *META,
                at(0),
            ),
        ),
        (ADMIN, 0, GARBAGE),
        jobs(hold("job-1", "vision", 30_000, 0)),
        jobs(hold("job-7", "vision", 20_000, 0)),
        (JOBS, 0, GARBAGE),
        samples(0, 1),
        samples(1, 1),
        (SAMPLES, 0, GARBAGE),
        samples(2, 1),
    ),
    (
        samples(0, 2),
        jobs(
            GpuAssigned(
                "GPU-p1", "node-01", POOL, MODEL, "job-1", "vision", "detection", "ada", at(0)
            )
        ),
        samples(1, 2),
        jobs(JobSubmitted(a_spec("job-7", submit_us=at(0)), at(0))),
        samples(2, 2),
        (SAMPLES, 1, b"[]"),
        (SAMPLES, 1, b'[{"id": 1}]'),
    ),
    (
        admin(AdjustmentRecorded(None, None, 0, None, *META, at(6), reverses_txn=REVERSED.id)),
        samples(0, 7),
        jobs(hold("job-9", "language", 5_000, 7)),
        samples(1, 7),
        samples(2, 7),
        (SAMPLES, 2, GARBAGE),
    ),
    (
        admin(PeriodClosed("2026-11", *META, at(8))),
        (ADMIN, 0, b'{"type": "tally.admin.price_set"}'),
        samples(0, 4),
        samples(1, 4),
        samples(2, 4),
        jobs(HoldReleased("job-1", at(9), "completed")),
        jobs(HoldReleased("job-7", at(9), "completed")),
        jobs(HoldReleased("job-9", at(9), "cancelled")),
    ),
    (samples(0, 10), samples(1, 10), samples(2, 10)),  # every shard's clock passes the releases
)


def located(stream: Sequence[Sequence[Item]]) -> list[list[ConsumedMessage]]:
    """The stream's batches as consumed messages, each partition numbering its offsets."""
    offsets: Counter[tuple[str, int]] = Counter()
    batches = []
    for batch in stream:
        messages = []
        for topic, partition, value in batch:
            messages.append(ConsumedMessage(topic, partition, offsets[(topic, partition)], value))
            offsets[(topic, partition)] += 1
        batches.append(messages)
    return batches


def one_per_batch(stream: Sequence[Sequence[Item]]) -> tuple[tuple[Item, ...], ...]:
    """Every message a batch of its own, in the same order."""
    return tuple((item,) for batch in stream for item in batch)


def ingestor(store: Store, role: ShardRole) -> Ingestor:
    return an_ingestor(store, replace(SHARDED, role=role), topics=TOPICS)


@dataclass
class Ledgers:
    whole: Store
    global_: Store
    samples: dict[int, Store]

    @property
    def shards(self) -> list[Store]:
        return [self.global_, *self.samples.values()]


def feed(stream: Sequence[Sequence[Item]], new_store: Callable[[str], Store]) -> Ledgers:
    """The stream applied to the whole ledger and to the shards, batch by batch; then the
    shards' watermark, computed from the samples shards, as one more admin batch to every
    ledger."""
    ledgers = Ledgers(
        new_store("whole"), new_store("global"), {p: new_store(f"samples-{p}") for p in PARTITIONS}
    )
    whole = ingestor(ledgers.whole, ShardRole.WHOLE)
    global_ = ingestor(ledgers.global_, ShardRole.GLOBAL)
    shards = {p: ingestor(s, ShardRole.SAMPLES) for p, s in ledgers.samples.items()}
    batches = located(stream)
    admin_offset = sum(1 for batch in batches for m in batch if m.topic == ADMIN)
    for batch in batches:
        whole.apply(batch)
        global_.apply([m for m in batch if m.topic != SAMPLES])
        for p, shard in shards.items():
            shard.apply([m for m in batch if m.topic != SAMPLES or m.partition == p])
    event = sealed_through(ledgers, admin_offset)
    for ingest in (whole, global_, *shards.values()):
        ingest.apply([event])
    return ledgers


def sealed_through(ledgers: Ledgers, offset: int) -> ConsumedMessage:
    """The global shard owner's `ShardsSealedThrough` for the samples shards as they are, for
    the jobs whose holds the global shard has open, as the admin message at `offset`."""
    found = {p: list(transactions(s).values()) for p, s in ledgers.samples.items()}
    newest = {
        f"samples-{p}": max(
            (t.end_us for t in txns if t.kind is TransactionKind.USAGE), default=None
        )
        for p, txns in found.items()
    }
    through = watermark(newest)
    assert through is not None and through >= at(9)  # past every release
    lines = usage_lines((t for txns in found.values() for t in txns), through)
    jobs_held = {job for job, _ in ledgers.global_.open_holds()}
    event = shards_sealed_through(through, newest, lines, jobs_held)
    assert {u.job_id for u in event.jobs} == {"job-1", "job-7"}  # job-9 used nothing
    return ConsumedMessage(ADMIN, 0, offset, admin(event)[2])


def transactions(store: Store) -> dict[str, Transaction]:
    if isinstance(store, MemoryStore):
        return {b.item.txn.txn_id: b.item.txn for b in store._s.booked}
    rows = store._con.execute(
        f"SELECT {POSTING_COLUMNS_SQL} FROM {store._all_postings_sql()} ORDER BY txn_id, leg"
    ).fetchall()
    found: dict[str, Transaction] = {}
    for txn_id in dict.fromkeys(row[0] for row in rows):
        txn = transaction_from_rows([r for r in rows if r[0] == txn_id])
        assert txn is not None
        found[str(txn_id)] = txn
    return found


def of_kinds(found: dict[str, Transaction], kinds: Sequence[TransactionKind]) -> dict[str, object]:
    return {i: t for i, t in found.items() if t.kind in kinds}


def balances(store: Store) -> Counter[tuple[str, str, str]]:
    return Counter({(r.account, r.unit, r.period): r.balance for r in store.balance_rows()})


def check_union(ledgers: Ledgers) -> None:
    whole = transactions(ledgers.whole)
    shards = [transactions(s) for s in ledgers.shards]
    usage_kinds = (TransactionKind.USAGE, TransactionKind.REVERSAL)
    union: dict[str, object] = {}
    for found in shards:
        kept = of_kinds(found, usage_kinds)
        assert not kept.keys() & union.keys(), "a transaction in two shards"
        union |= kept
    assert union == of_kinds(whole, usage_kinds)
    # among them: the admin's reversal, a late owner's and a late assignment's corrections
    for corrected in (REVERSED, sample(1, 1), sample(2, 1)):
        assert ledgers.whole.reversed_by(corrected.id) in union
    # grants and adjustments are the global's, and the whole's
    money = (TransactionKind.BUDGET_GRANT, TransactionKind.ADJUSTMENT)
    assert of_kinds(shards[0], money) == of_kinds(whole, money)
    assert len(of_kinds(whole, (TransactionKind.BUDGET_GRANT,))) == 3  # one-off, Nov, Dec
    for found in shards[1:]:
        assert of_kinds(found, (*money, *HOLD_KINDS)) == {}
    # dead letters: the samples shards' from samples, the global's from admin and jobs
    letters = Counter(ledgers.global_.dead_letters())
    for store in ledgers.samples.values():
        assert {row[0] for row in store.dead_letters()} <= {SAMPLES}
        letters += Counter(store.dead_letters())
    whole_letters = Counter(ledgers.whole.dead_letters())
    assert {row[0] for row in whole_letters} == {ADMIN, JOBS, SAMPLES}
    assert letters == whole_letters
    assert max(letters.values()) == 1
    # balances per period, the hold accounts apart
    summed: Counter[tuple[str, str, str]] = Counter()
    for store in ledgers.shards:
        summed.update(balances(store))
    whole_balances = balances(ledgers.whole)
    assert whole_balances  # the stream books something
    for name, rows in (("whole", whole_balances), ("union", summed)):
        held: Counter[tuple[str, str]] = Counter()
        for (account, unit, _), amount in rows.items():
            if account.startswith(HOLD_ACCOUNTS):
                held[(account, unit)] += amount
        assert held and not +held and not -held, name  # placed, and all released
    assert _without_holds(summed) == _without_holds(whole_balances)
    # each hold placed, settled and released as in the whole, settled from the event's usage
    whole_holds = _hold_sums(ledgers.whole)
    assert whole_holds == _hold_sums(ledgers.global_)
    assert whole_holds[("hold:vision", TransactionKind.HOLD_SETTLE)] < 0  # usage settled some
    assert ledgers.global_.open_holds() == {}
    for store in (ledgers.whole, *ledgers.samples.values()):
        sealed = [e for e in store.admin_entries() if e.envelope.type.endswith("sealed_through")]
        assert [e.outcome for e in sealed] == [SEALED_ELSEWHERE]
    # a samples shard holds no holds and publishes no balances; the whole and the global do
    for store in ledgers.samples.values():
        assert store.open_holds() == {}
        assert all(m.topic != "balances" for m in store.pending_outbox(10_000))
    for store in (ledgers.whole, ledgers.global_):
        assert any(m.topic == "balances" for m in store.pending_outbox(10_000))
    # the global logs the reversal its samples shard posted
    outcomes = {e.envelope.id: e.outcome for e in ledgers.global_.admin_entries()}
    reversal = next(i for i, t in union.items() if isinstance(t, Transaction) and i in outcomes)
    assert outcomes[reversal] == ELSEWHERE_OUTCOME


def _hold_sums(store: Store) -> Counter[tuple[str, TransactionKind]]:
    """The hold accounts' postings summed per (account, transaction kind), over periods."""
    sums: Counter[tuple[str, TransactionKind]] = Counter()
    for txn in transactions(store).values():
        for p in txn.postings:
            if p.account.startswith(HOLD_ACCOUNTS):
                sums[(p.account, txn.kind)] += p.amount
    return sums


def _without_holds(rows: Counter[tuple[str, str, str]]) -> dict[tuple[str, str, str], int]:
    return {k: v for k, v in rows.items() if v and not k[0].startswith(HOLD_ACCOUNTS)}


ORDERS = {"interleaved-batches": STREAM, "one-message-per-batch": one_per_batch(STREAM)}


@pytest.mark.parametrize("stream", ORDERS.values(), ids=ORDERS.keys())
def test_the_shards_sum_to_the_whole_in_memory(stream: tuple[tuple[Item, ...], ...]) -> None:
    check_union(feed(stream, lambda _: MemoryStore()))


def test_the_shards_sum_to_the_whole_on_duckdb() -> None:
    """… and a samples shard, sealed, rebuilds from its own archive with its directory's role
    (`ledger.store.union_rebuild.role_of`, as `tally ledger rebuild` does); replayed as a whole
    ledger, it would not."""
    with tempfile.TemporaryDirectory(dir=SCRATCH) as root:
        shards = Path(root) / "shards"
        ledgers = feed(STREAM, lambda name: DuckDBStore(shards / name))
        try:
            check_union(ledgers)
            ledgers.samples[0].seal()
        finally:
            for store in (ledgers.whole, *ledgers.shards):
                store.close()
        replay = SHARDED
        shard = shards / "samples-0"
        rebuilt = rebuild(shard, Path(root) / "rebuilt", replace(replay, role=role_of(shard)))
        assert rebuilt.identical, rebuilt.differences
        assert not rebuild(shard, Path(root) / "as-whole", replay).identical
        # every shard published, pulled as one union, rebuilt shard by shard with its role
        objects = LocalObjectStore(Path(root) / "objects")
        for name in (GLOBAL_SHARD, *(f"samples-{p}" for p in ledgers.samples)):
            with DuckDBStore(shards / name) as store:
                store.seal()
            Publisher(shards / name, PrefixedStore(objects, f"shards/{name}")).push()
        union = pull(objects, Path(root) / "union")
        reports = list(rebuild_members(union, Path(root) / "union-rebuilt", lambda _: replay))
        assert [m.shard for m, _r in reports] == union_shards(union)
        assert {role_of(m.live) for m, _r in reports} == {ShardRole.GLOBAL, ShardRole.SAMPLES}
        assert all(r.identical for _m, r in reports), [r.differences for _m, r in reports]
        assert named_report(reports, union).batches == sum(
            archive_batch_count(shards / m.shard)[0] for m, _r in reports
        )


@st.composite
def refined(draw: st.DrawFn) -> tuple[tuple[Item, ...], ...]:
    """`STREAM` with each batch cut into smaller ones at drawn points (never merged: a batch
    folds admin before samples, so merging could fold a reversal before its target, the gap
    `ledger.ingest.shards` names)."""
    batches: list[tuple[Item, ...]] = []
    for batch in STREAM:
        cuts = draw(st.sets(st.integers(1, len(batch) - 1), max_size=3))
        bounds = [0, *sorted(cuts), len(batch)]
        batches.extend(batch[a:b] for a, b in pairwise(bounds))
    return tuple(batches)


@settings(max_examples=8, deadline=None, derandomize=True)
@given(refined())
def test_the_shards_sum_to_the_whole_however_the_batches_are_cut(
    stream: tuple[tuple[Item, ...], ...],
) -> None:
    check_union(feed(stream, lambda _: MemoryStore()))
