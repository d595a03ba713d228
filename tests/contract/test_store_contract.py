"""The ledger store port's contract (`ledger.store.port.LedgerStore`): one suite, run against the
DuckDB store (`duckdb`) and the in-memory one (`memory`). A few tests at the end feed both stores
the same batches and compare what only both together can show (checksums, balance messages)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from ledger.admin import AppliedAdmin, PeriodClosed, TeamDefined, admin_envelope
from ledger.assignments import Holding
from ledger.audit import AuditEntry
from ledger.balances import decode_balance_update
from ledger.closing import CHECKSUM_ALGORITHM
from ledger.errors import StoreError
from ledger.events import DeadLetter, Owner, encode_batch
from ledger.holds import OpenHold
from ledger.idle import GpuIdleState
from ledger.ingest import Ingestor
from ledger.periods import period_label
from ledger.postings import Posting, Transaction, TransactionKind
from ledger.pricing import Price, PriceBook
from ledger.store.hot import DuckDBStore
from ledger.store.memory import MemoryStore
from ledger.store.port import (
    ConsumedMessage,
    OffsetRange,
    OutboxMessage,
    SourcedTransaction,
    StateChanges,
    ViewKeys,
)
from ledger.units import Unit
from tests.builders import INTERVAL_US, T0_US, a_process, an_envelope, an_owner

INC = "cluster-a"
TOPIC = "samples"
NOV, DEC = "2026-11", "2026-12"
DEC_US = T0_US + 30 * 86_400_000_000  # 2026-12-01
CONSUMER = "consumer:vision/detection"
CAPACITY = "capacity:h100/H100"


# ---------------------------------------------------------------------------- builders


def a_txn(
    txn_id: str,
    amount: int = 100,
    *,
    at_us: int = T0_US + INTERVAL_US,
    kind: TransactionKind = TransactionKind.USAGE,
    debit: str = CONSUMER,
    credit: str = CAPACITY,
    unit: Unit = Unit.GPU_MS,
    team: str = "vision",
    period: str | None = None,
) -> Transaction:
    """A balanced two-leg transaction: `amount` onto `debit`, off `credit`."""
    return Transaction(
        txn_id=txn_id,
        kind=kind,
        start_us=at_us - INTERVAL_US,
        end_us=at_us,
        gpu_uuid="GPU-1" if kind is TransactionKind.USAGE else "",
        model="H100" if kind is TransactionKind.USAGE else "",
        pool="h100" if kind is TransactionKind.USAGE else "",
        node="node-01" if kind is TransactionKind.USAGE else "",
        postings=(
            Posting(debit, unit, amount, team, "detection", "ada", "job-1", "research"),
            Posting(credit, unit, -amount),
        ),
        cause=(f"event-{txn_id}",),
        period=period or period_label(at_us - INTERVAL_US),
        util_pct=90 if kind is TransactionKind.USAGE else None,
    )


def a_grant(txn_id: str, amount: int, period: str = NOV) -> Transaction:
    """A budget grant of `amount` micros to vision: `budget:vision` is credited."""
    return a_txn(
        txn_id,
        -amount,
        kind=TransactionKind.BUDGET_GRANT,
        debit="budget:vision",
        credit="funding:research",
        unit=Unit.MONEY,
        period=period,
    )


def sourced(txns: list[Transaction], first_offset: int = 0) -> list[SourcedTransaction]:
    return [SourcedTransaction(t, TOPIC, 0, first_offset + i) for i, t in enumerate(txns)]


def commit(store, *txns: Transaction, offset: int = 0, incarnation: str = INC, **kwargs):
    """Commit `txns` as one batch consumed from offsets `offset..` of partition 0."""
    last = offset + max(len(txns), 1) - 1
    return store.commit(
        incarnation,
        [OffsetRange(TOPIC, 0, offset, last)],
        sourced(list(txns), offset),
        **kwargs,
    )


def closing(period: str = NOV) -> AppliedAdmin:
    return AppliedAdmin(admin_envelope(PeriodClosed(period, "alice", "month end", DEC_US)))


def a_team(name: str = "vision") -> AppliedAdmin:
    event = TeamDefined(name, "research", ("detection",), ("ada",), "alice", "setup", T0_US)
    return AppliedAdmin(admin_envelope(event))


def a_hold(job: str = "job-1", amount: int = 500, unit: Unit = Unit.MONEY) -> OpenHold:
    return OpenHold(job, unit, "vision", "detection", amount, T0_US + 3_600_000_000, "h-1")


def an_idle_state(subject: str = "GPU-1", last: int = T0_US, waste: int = 0) -> GpuIdleState:
    return GpuIdleState(subject, last, an_owner(), below_since_us=T0_US, waste_gpu_ms=waste)


def observable(store) -> tuple[object, ...]:
    """Everything a reader can see of a store, for "nothing changed" checks."""
    return (
        store.batch_seq,
        store.applied_offsets(INC),
        store.balance_rows(),
        store.folded_balances(),
        store.hot_rows(),
        store.seen_ids(["a", "b", "c", "seen-1"]),
        store.pending_outbox(),
        store.dead_letters(),
        store.open_holds(),
        store.admin_entries(),
        store.closed_periods(),
        store.audit_records(),
        store.load_view(ViewKeys(gpu_uuids=frozenset({"GPU-1"}), subjects=frozenset({"GPU-1"}))),
    )


@pytest.fixture(params=["duckdb", "memory"])
def store(request, tmp_path):
    s = DuckDBStore(tmp_path / "ledger") if request.param == "duckdb" else MemoryStore()
    yield s
    s.close()


def both_stores(tmp_path) -> tuple[DuckDBStore, MemoryStore]:
    return DuckDBStore(tmp_path / "ledger"), MemoryStore()


# ---------------------------------------------------------------------------- exactly once


@dataclass(frozen=True, slots=True)
class DedupeCase:
    before: tuple[str, ...]  # ids committed in an earlier batch
    batch: tuple[str, ...]  # ids of the batch under test
    expect: tuple[int, int, int]  # (transactions, postings, duplicates)


DEDUPE = {
    "all-fresh": DedupeCase((), ("a", "b"), (2, 4, 0)),
    "applied-before": DedupeCase(("a",), ("a", "b"), (1, 2, 1)),
    "repeat-within-batch": DedupeCase((), ("a", "b", "a"), (2, 4, 1)),
    "all-seen": DedupeCase(("a", "b"), ("b", "a", "b"), (0, 0, 3)),
}


@pytest.mark.parametrize("case", DEDUPE.values(), ids=DEDUPE.keys())
def test_a_transaction_is_applied_exactly_once(store, case):
    if case.before:
        commit(store, *(a_txn(i) for i in case.before), offset=100)
    result = commit(store, *(a_txn(i) for i in case.batch))
    assert (result.transactions, result.postings, result.duplicates) == case.expect
    assert store.balance_rows() == store.folded_balances()
    consumed = sum(r.balance for r in store.balance_rows() if r.account == CONSUMER)
    assert consumed == 100 * len({*case.before, *case.batch})  # each id counted once


def test_applied_offsets_are_kept_per_incarnation(store):
    assert store.applied_offsets(INC) == {}
    commit(store, a_txn("a"), a_txn("b"), offset=0)
    store.commit(INC, [OffsetRange("admin", 3, 7, 9)], [])
    commit(store, a_txn("c"), offset=5, incarnation="cluster-b")
    assert store.applied_offsets(INC) == {(TOPIC, 0): 2, ("admin", 3): 10}
    assert store.applied_offsets("cluster-b") == {(TOPIC, 0): 6}
    assert store.applied_offsets("cluster-c") == {}


def test_seen_ids_are_transactions_and_events_applied(store):
    commit(store, a_txn("a"), changes=StateChanges(seen=[("seen-1", T0_US, "assign:GPU-1")]))
    assert store.seen_ids(["a", "seen-1", "b"]) == {"a", "seen-1"}
    assert store.seen_ids([]) == set()


def test_batch_seq_counts_batches_committed_with_their_messages(store):
    commit(store, a_txn("a"))  # no raw messages: no archived batch
    assert store.batch_seq == 0
    raw = [ConsumedMessage(TOPIC, 0, 1, b"x"), ConsumedMessage(TOPIC, 0, 2, b"y")]
    commit(store, a_txn("b"), a_txn("c"), offset=1, raw=raw)
    assert store.batch_seq == 1
    with pytest.raises(StoreError, match="span"):
        commit(store, a_txn("d"), offset=3, raw=raw)
    assert store.batch_seq == 1


# ---------------------------------------------------------------------------- balances


def test_the_balances_projection_is_the_fold_of_the_postings(store):
    commit(store, a_txn("a", 100), a_txn("b", 250), offset=0)
    commit(store, a_txn("c", 7, at_us=DEC_US + INTERVAL_US), a_grant("g", 1_000), offset=2)
    commit(store, a_txn("a", 999), a_txn("d", -57), offset=4)  # "a" again: dropped
    rows = store.balance_rows()
    assert rows == store.folded_balances()
    assert {(r.account, r.unit, r.period): r.balance for r in rows} == {
        (CONSUMER, "gpu_ms", NOV): 293,
        (CAPACITY, "gpu_ms", NOV): -293,
        (CONSUMER, "gpu_ms", DEC): 7,
        (CAPACITY, "gpu_ms", DEC): -7,
        ("budget:vision", "money_micros", NOV): -1_000,
        ("funding:research", "money_micros", NOV): 1_000,
    }
    assert rows == sorted(rows, key=lambda r: (r.account, r.unit, r.period))
    view = store.load_view(ViewKeys(budget_keys=frozenset({("vision", NOV, Unit.MONEY)})))
    assert view.budget_totals == {("vision", NOV, Unit.MONEY): 1_000}


# ---------------------------------------------------------------------------- period close


def test_nothing_is_booked_into_a_closed_period(store):
    commit(store, a_txn("a"))
    store.seal()
    commit(store, changes=StateChanges(admin=[closing(NOV)]), offset=1)
    before = observable(store)
    with pytest.raises(StoreError, match="closed"):
        entry = AuditEntry("refused", T0_US, "admin.price_set", "alice", "admin", "cli", "H100")
        late = (a_txn("b", at_us=DEC_US + INTERVAL_US), a_txn("late"))
        commit(store, *late, offset=2, changes=StateChanges(audit=[entry]))
    assert observable(store) == before  # nor the open-period one, nor its audit entry
    assert commit(store, a_txn("b", at_us=DEC_US + INTERVAL_US), offset=2).transactions == 1


def test_a_close_needs_everything_sealed_and_records_the_checksum(store):
    commit(store, a_txn("a"), a_txn("b", 30), a_txn("c", 5, at_us=DEC_US + INTERVAL_US))
    with pytest.raises(StoreError, match="seal"):
        commit(store, changes=StateChanges(admin=[closing(NOV)]), offset=3)
    assert store.closed_periods() == []
    assert store.closed_period_labels() == frozenset()
    store.seal()
    result = commit(store, changes=StateChanges(admin=[closing(NOV)]), offset=3)
    assert result.closed == (NOV,)
    [closed] = store.closed_periods()
    assert (closed.period, closed.event_id, closed.rows) == (NOV, closing().envelope.id, 4)
    assert (closed.actor, closed.reason, closed.effective_us) == ("alice", "month end", DEC_US)
    assert closed.algorithm == CHECKSUM_ALGORITHM and len(closed.sha256) == 64
    assert store.closed_period_labels() == frozenset({NOV})
    assert store.load_view(ViewKeys()).closed == frozenset({NOV})
    assert store.admin_view().closed == frozenset({NOV})


def test_closing_a_period_twice_is_refused(store):
    commit(store, changes=StateChanges(admin=[closing(NOV)]))
    store.seal()
    again = AppliedAdmin(admin_envelope(PeriodClosed(NOV, "bob", "again", DEC_US + 1)))
    with pytest.raises(StoreError):
        commit(store, changes=StateChanges(admin=[again]), offset=1)
    assert [c.actor for c in store.closed_periods()] == ["alice"]


# ---------------------------------------------------------------------------- state changes


def test_state_changes_round_trip_through_load_view(store):
    timeline = (
        Holding("GPU-1", an_owner(), T0_US, T0_US + 60_000_000),
        Holding("GPU-1", Owner("language", None, None, "job-9"), T0_US + 60_000_000),
    )
    changes = StateChanges(
        holds=[a_hold("job-1"), a_hold("job-2", 70, Unit.GPU_MS)],
        admin=[a_team("vision")],
        reversals=[("a", "rev-a")],
        seen=[("seen-1", T0_US, "assign:GPU-1")],
        timelines={"GPU-1": timeline, "GPU-2": timeline[:1]},
    )
    commit(store, a_txn("a"), idle_states=[an_idle_state("GPU-1")], changes=changes)
    everything = ViewKeys(
        event_ids=["a", "seen-1", "nope"],
        admin_ids=[a_team().envelope.id, "nope"],
        gpu_uuids=frozenset({"GPU-1", "GPU-3"}),
        subjects=frozenset({"GPU-1", "GPU-3"}),
        budget_keys=frozenset({("vision", NOV, Unit.MONEY)}),
        txn_ids=frozenset({"a", "nope"}),
        holds=True,
        admin=True,
    )
    view = store.load_view(everything)
    assert view.seen == {"a", "seen-1"}
    assert view.admin_applied == {a_team().envelope.id}
    assert view.timelines == {"GPU-1": timeline}
    assert view.idle == {"GPU-1": an_idle_state("GPU-1")}
    assert view.holds == {h.key: h for h in changes.holds}
    assert view.budget_totals == {("vision", NOV, Unit.MONEY): 0}
    assert view.transactions == {"a": a_txn("a")}
    assert view.reversed_by == {"a": "rev-a"}
    assert set(view.admin.teams) == {"vision"}
    assert store.admin_entries() == [a_team("vision")]
    assert store.open_holds() == view.holds

    nothing = store.load_view(ViewKeys())  # only what was asked for comes back
    assert (nothing.seen, nothing.admin_applied, nothing.transactions) == (set(), set(), {})
    assert (nothing.timelines, nothing.idle, nothing.holds, nothing.reversed_by) == ({}, {}, {}, {})
    assert (nothing.budget_totals, nothing.admin.teams) == ({}, {})


def test_holds_and_timelines_are_replaced_and_a_zero_hold_is_removed(store):
    first = (Holding("GPU-1", an_owner(), T0_US),)
    commit(
        store,
        changes=StateChanges(holds=[a_hold("job-1"), a_hold("job-2")], timelines={"GPU-1": first}),
    )
    later = (Holding("GPU-1", an_owner(team="language"), T0_US + 5),)
    commit(
        store,
        offset=1,
        changes=StateChanges(
            holds=[replace(a_hold("job-1"), amount=0), replace(a_hold("job-2"), amount=9)],
            timelines={"GPU-1": later},
        ),
    )
    assert store.open_holds() == {("job-2", Unit.MONEY): replace(a_hold("job-2"), amount=9)}
    assert store.load_view(ViewKeys(gpu_uuids=frozenset({"GPU-1"}))).timelines == {"GPU-1": later}


def test_idle_states_replace_the_stored_ones(store):
    commit(store, idle_states=[an_idle_state("GPU-1"), an_idle_state("GPU-2")])
    commit(store, offset=1, idle_states=[an_idle_state("GPU-1", T0_US + 99, waste=42)])
    idle = store.load_view(ViewKeys(subjects=frozenset({"GPU-1", "GPU-2"}))).idle
    assert idle == {
        "GPU-1": an_idle_state("GPU-1", T0_US + 99, waste=42),
        "GPU-2": an_idle_state("GPU-2"),
    }


def test_a_future_date_in_one_scope_ages_out_nothing_in_another(store):
    commit(store, a_txn("a", at_us=T0_US + 10 * INTERVAL_US))
    far = replace(a_grant("g", 5), end_us=T0_US + 10**12, start_us=T0_US)  # a future date
    later = [("seen-1", T0_US + 10**12, "assign:GPU-1")]
    commit(store, far, offset=1, changes=StateChanges(seen=later))
    assert store.prune_seen_events(window_us=INTERVAL_US) == 0  # each is its scope's newest
    assert store.seen_ids(["a", "g", "seen-1"]) == {"a", "g", "seen-1"}


# ---------------------------------------------------------------------------- outbox


def message(n: int, topic: str = "alerts") -> OutboxMessage:
    return OutboxMessage(f"m-{n}", topic, f"k{n}".encode(), f"v{n}".encode())


def test_the_outbox_holds_messages_until_marked_sent(store):
    commit(store, outbox=[message(1), message(2)])
    resent = replace(message(2), value=b"changed")  # m-2 is queued already: kept as it was
    commit(store, offset=1, outbox=[resent, message(3)])
    assert [m.id for m in store.pending_outbox()] == ["m-1", "m-2", "m-3"]
    assert store.pending_outbox(limit=2) == [message(1), message(2)]
    assert store.pending_outbox()[2] == message(3)
    store.mark_sent(["m-1", "m-3", "never-queued"])
    assert store.pending_outbox() == [message(2)]
    commit(store, offset=2, outbox=[message(1)])  # sent and forgotten: queued again
    assert [m.id for m in store.pending_outbox()] == ["m-2", "m-1"]


def test_a_refused_message_leaves_the_outbox_and_is_kept_undeliverable(store):
    commit(store, outbox=[message(1), message(2), message(3)])
    store.mark_undeliverable("m-2", "MessageSizeTooLargeError: " + "x" * 100_000)
    store.mark_undeliverable("never-queued", "ignored")
    assert [m.id for m in store.pending_outbox()] == ["m-1", "m-3"]
    [kept] = store.undeliverable()
    assert kept.message == message(2)
    assert kept.reason.startswith("MessageSizeTooLargeError: xxx")
    assert len(kept.reason) <= 2048 and "[cut: 100026 chars, sha256 " in kept.reason
    store.mark_sent(["m-1", "m-2", "m-3"])  # the worker goes on with the rest
    assert store.pending_outbox() == []
    assert [u.message.id for u in store.undeliverable()] == ["m-2"]


def test_balances_messages_are_queued_when_a_topic_is_given(store):
    assert commit(store, a_txn("a")).balances_published == 0
    result = commit(store, a_txn("b"), a_grant("g", 1_000), offset=1, balances_topic="balances")
    queued = [m for m in store.pending_outbox() if m.topic == "balances"]
    assert result.balances_published == len(queued) > 0
    keys = {m.key for m in queued}
    assert {CONSUMER.encode(), CAPACITY.encode(), b"budget:vision"} <= keys
    budget = decode_balance_update(next(m.value for m in queued if m.key == b"budget:vision"))
    assert budget.budget is not None and budget.budget.line("money_micros").granted == 1_000
    again = commit(store, a_txn("c"), offset=3, balances_topic="balances")
    pending = [m for m in store.pending_outbox() if m.topic == "balances"]
    assert len(pending) == len(keys | {m.key for m in pending})  # one unsent per account
    assert again.balances_published > 0


def test_dead_letters_are_recorded(store):
    letters = [
        DeadLetter("not JSON", "garbage", None, TOPIC, 0, 3),
        DeadLetter("no price", "{}", "ev-1", TOPIC, 1, 8),
    ]
    result = commit(store, a_txn("a"), dead_letters=letters)
    assert result.dead_letters == 2
    assert store.dead_letters() == [
        (TOPIC, 0, 3, None, "not JSON"),
        (TOPIC, 1, 8, "ev-1", "no price"),
    ]


# ---------------------------------------------------------------------------- pruning, sealing


def test_prune_seen_before_forgets_older_ids(store):
    commit(
        store, a_txn("a", at_us=T0_US + 1 * INTERVAL_US), a_txn("b", at_us=T0_US + 5 * INTERVAL_US)
    )
    commit(
        store,
        offset=2,
        changes=StateChanges(seen=[("seen-1", T0_US + 3 * INTERVAL_US, "assign:GPU-1")]),
    )
    assert store.prune_seen_before(T0_US + 3 * INTERVAL_US) == 1
    assert store.seen_ids(["a", "b", "seen-1"]) == {"b", "seen-1"}
    assert store.prune_seen_before(T0_US) == 0
    assert commit(store, a_txn("a"), offset=3).transactions == 1  # forgotten: applied again


def on_gpu(txn: Transaction, gpu: str) -> Transaction:
    return replace(txn, gpu_uuid=gpu)


def test_prune_forgets_per_scope_and_a_lagging_scope_keeps_its_ids(store):
    minute = INTERVAL_US
    commit(
        store,
        a_txn("a", at_us=T0_US + 1 * minute),
        a_txn("b", at_us=T0_US + 20 * minute),
        on_gpu(a_txn("c", at_us=T0_US + 1 * minute), "GPU-2"),  # GPU-2 fell silent at 3
        on_gpu(a_txn("d", at_us=T0_US + 3 * minute), "GPU-2"),
        changes=StateChanges(seen=[("seen-1", T0_US + 2 * minute, "assign:GPU-1")]),
    )
    scopes = ["gpu:GPU-1", "gpu:GPU-2", "assign:GPU-1", "gpu:GPU-3"]
    assert store.forgotten_before(scopes) == {}  # nothing pruned yet

    assert store.prune_seen_events(window_us=10 * minute) == 1
    assert store.seen_ids(["a", "b", "c", "d", "seen-1"]) == {"b", "c", "d", "seen-1"}
    cutoffs = {
        "gpu:GPU-1": T0_US + 10 * minute,
        "gpu:GPU-2": T0_US - 7 * minute,
        "assign:GPU-1": T0_US - 8 * minute,
    }
    assert store.forgotten_before(scopes) == cutoffs  # a scope never applied has none
    view = store.load_view(ViewKeys(scopes=frozenset(scopes[:2])))
    assert view.forgotten_before == {s: cutoffs[s] for s in scopes[:2]}
    assert store.load_view(ViewKeys()).forgotten_before == {}


def test_a_cutoff_only_rises_and_outlives_the_ids_of_its_scope(store):
    minute = INTERVAL_US
    commit(store, a_txn("a", at_us=T0_US + 1 * minute), a_txn("b", at_us=T0_US + 5 * minute))
    assert store.prune_seen_before(T0_US + 6 * minute) == 2  # every id of the scope
    assert store.seen_ids(["a", "b"]) == set()
    assert store.prune_seen_events(window_us=10 * minute) == 0
    assert store.forgotten_before(["gpu:GPU-1"]) == {"gpu:GPU-1": T0_US + 6 * minute}
    commit(store, a_txn("e", at_us=T0_US + 30 * minute), offset=2)  # the scope moves on
    assert store.prune_seen_events(window_us=10 * minute) == 0
    assert store.forgotten_before(["gpu:GPU-1"]) == {"gpu:GPU-1": T0_US + 20 * minute}


def test_sealing_empties_the_hot_rows_and_changes_no_read(store):
    txns = [a_txn("a"), a_txn("b", 3), a_grant("g", 50)]
    commit(store, *txns)
    before = (store.balance_rows(), store.folded_balances())
    assert store.hot_rows() == 6
    assert store.find_transaction("b") == txns[1]
    store.seal()
    assert store.hot_rows() == 0
    assert (store.balance_rows(), store.folded_balances()) == before
    assert [store.find_transaction(t.txn_id) for t in txns] == txns
    assert store.find_transaction("nope") is None
    commit(store, a_txn("c"), offset=3)
    assert store.hot_rows() == 2


# ---------------------------------------------------------------------------- atomicity


def test_a_commit_that_fails_midway_leaves_nothing(store, monkeypatch):
    commit(store, a_txn("a"), idle_states=[an_idle_state()], outbox=[message(1)])
    before = observable(store)

    def explode(*_args, **_kwargs):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(store, "_apply_changes", explode)  # after postings, seen and ranges
    with pytest.raises(RuntimeError):
        commit(
            store,
            a_txn("b"),
            offset=1,
            idle_states=[an_idle_state(waste=9)],
            outbox=[message(2)],
            dead_letters=[DeadLetter("bad", "x", None, TOPIC, 0, 1)],
            changes=StateChanges(holds=[a_hold()], seen=[("seen-1", T0_US, "assign:GPU-1")]),
            balances_topic="balances",
            raw=[ConsumedMessage(TOPIC, 0, 1, b"x")],
        )
    assert observable(store) == before
    monkeypatch.undo()
    assert commit(store, a_txn("b"), offset=1).transactions == 1


# ---------------------------------------------------------------------------- ingest


PRICES = PriceBook((Price("*", 3_600_000),))


def samples(offset: int, *minutes: int) -> ConsumedMessage:
    envelopes = [
        an_envelope(
            sample_time_us=T0_US + m * INTERVAL_US, processes=(a_process(owner=an_owner()),)
        )
        for m in minutes
    ]
    return ConsumedMessage(TOPIC, 0, offset, encode_batch(envelopes))


def test_the_ingestor_runs_on_the_store(store):
    ingest = Ingestor(store, INC, PRICES, {"vision": "research"})
    first = ingest.apply([samples(0, 1, 2), samples(1, 3)])
    again = ingest.apply([samples(1, 3), samples(2, 3, 4)])
    assert (first.commit.transactions, again.commit.transactions) == (3, 1)
    assert again.commit.duplicates == 1
    assert store.applied_offsets(INC) == {(TOPIC, 0): 3}
    assert store.balance_rows() == store.folded_balances()
    assert sum(r.balance for r in store.balance_rows() if r.account.startswith("consumer:")) > 0


# ---------------------------------------------------------------------------- both stores agree


def test_both_stores_record_the_same_close_checksum(tmp_path):
    odd = replace(
        a_txn('é/"q"\\', 9),
        cause=("x y", "ünï"),
        postings=(
            Posting(CONSUMER, Unit.GPU_MS, 9, "vïsion", "dé/tection", None, "job\t1"),
            Posting(CAPACITY, Unit.GPU_MS, -9),
        ),
    )
    txns = [a_txn("b"), a_txn("a", 3), odd, a_grant("g", 5), a_txn("z", at_us=DEC_US + INTERVAL_US)]
    idle_leg = replace(odd.postings[0], amount=4, idle=True)  # a GPU share's idle leg
    busy_leg = replace(idle_leg, amount=5, idle=False)
    share = replace(a_txn("s", 9), postings=(idle_leg, busy_leg, odd.postings[1]))
    txns += [replace(a_txn("w"), idle=True), share]  # a whole GPU's idle usage; a shared GPU's
    checksums = []
    for store in both_stores(tmp_path):
        commit(store, *txns)
        store.seal()
        commit(store, changes=StateChanges(admin=[closing(NOV)]), offset=len(txns))
        store.seal()  # re-sealing changes nothing
        checksums.append(store.closed_periods())
        store.close()
    duck, memory = checksums
    assert memory == duck
    assert memory[0].rows == 13


def test_both_stores_queue_the_same_balances_messages(tmp_path):
    batches = [
        [a_txn("a"), a_grant("g", 1_000)],
        # moves the current period: vision's budget is republished, though vision did nothing
        [a_txn("b", at_us=DEC_US + INTERVAL_US, debit="consumer:language/x", team="language")],
        [a_txn("c", 5, debit="consumer:language/pretraining", team="language")],
    ]
    queued = []
    for store in both_stores(tmp_path):
        counts = [
            commit(store, *batch, offset=10 * i, balances_topic="bal").balances_published
            for i, batch in enumerate(batches)
        ]
        updates = [
            (m.key, decode_balance_update(m.value))
            for m in store.pending_outbox()
            if m.topic == "bal"
        ]
        queued.append(
            (
                counts,
                [(k, u.seq, u.current_period, u.periods, u.totals, u.budget) for k, u in updates],
            )
        )
        store.close()
    duck, memory = queued
    assert memory == duck
    assert (duck[0], len(duck[1])) == ([4, 3, 2], 6)  # one unsent message per account


def test_a_period_close_republishes_its_accounts_in_both_stores(tmp_path):
    published = []
    for store in both_stores(tmp_path):
        commit(store, a_txn("a"), balances_topic="bal")
        store.mark_sent([m.id for m in store.pending_outbox()])
        store.seal()
        result = commit(
            store, offset=1, changes=StateChanges(admin=[closing(NOV)]), balances_topic="bal"
        )
        published.append((result.balances_published, sorted(m.key for m in store.pending_outbox())))
        store.close()
    assert published[0] == published[1]
    assert published[0][0] == 2
