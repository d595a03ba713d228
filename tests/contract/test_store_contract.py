"""The ledger store port's contract (`ledger.store.port.LedgerStore`), first part: one suite
run against the DuckDB store (`duckdb`) and the in-memory one (`memory`) — exactly-once
commits, the balances projection, period close, state changes and the outbox. Pruning,
sealing, atomicity, ingest and what both stores must agree on are in
`test_store_sealing_contract.py`; the fixture and builders in `store_support.py`."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from ledger.admin import AppliedAdmin, PeriodClosed, admin_envelope
from ledger.assignments import Holding
from ledger.audit import AuditEntry
from ledger.balances import JobAmount, ShardStamp, balance_key, decode_balance_update
from ledger.closing import CHECKSUM_ALGORITHM
from ledger.errors import StoreError
from ledger.events import DeadLetter, Owner
from ledger.postings import TransactionKind
from ledger.store.port import (
    ConsumedMessage,
    OffsetRange,
    StateChanges,
    ViewKeys,
)
from ledger.units import Unit
from tests.builders import INTERVAL_US, T0_US, an_owner
from tests.contract.store_support import (
    CAPACITY,
    CONSUMER,
    DEC,
    DEC_US,
    INC,
    NOV,
    TOPIC,
    a_grant,
    a_hold,
    a_team,
    a_txn,
    an_idle_state,
    closing,
    commit,
    message,
    observable,
)

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


def test_a_jobs_hold_baseline_is_kept_with_its_settlement_and_replaced(store):
    """A global shard's settlement removes the hold and moves its job's baseline in one commit
    (`StateChanges.baselines`); the baseline outlives the hold, the next settlement replaces
    it, and a retry's hold keeps its baseline and earlier part like any of its fields."""
    retry = replace(a_hold("job-1", 800), baseline=400, earlier=300)
    commit(store, changes=StateChanges(holds=[retry], baselines={("job-2", Unit.GPU_MS): 70}))
    settled = StateChanges(
        holds=[replace(retry, amount=0)],
        baselines={("job-1", Unit.MONEY): 900, ("job-1", Unit.GPU_MS): 5},
    )
    assert store.open_holds() == {retry.key: retry}
    commit(store, offset=1, changes=settled)
    commit(store, offset=2, changes=StateChanges(baselines={("job-1", Unit.MONEY): 1_200}))
    expected = {("job-1", Unit.MONEY): 1_200, ("job-1", Unit.GPU_MS): 5, ("job-2", Unit.GPU_MS): 70}
    assert (store.open_holds(), store.hold_baselines()) == ({}, expected)
    assert store.hold_baselines(["job-2", "job-9"]) == {("job-2", Unit.GPU_MS): 70}
    placing = ViewKeys(holds=True, hold_jobs=frozenset({"job-1"}))  # a batch placing job-1's
    assert store.load_view(placing).baselines == {
        k: v for k, v in expected.items() if k[0] == "job-1"
    }
    assert store.load_view(ViewKeys(holds=True)).baselines == {}  # only the jobs asked for


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


SHARDS = {"a-shard": ShardStamp("samples-0", 3), "a-whole-ledger": None}


@pytest.mark.parametrize("stamp", SHARDS.values(), ids=SHARDS.keys())
def test_a_shard_lists_its_jobs_usage_so_far_and_its_teams_open_holds(store, stamp):
    """A stamped shard's consumer message lists each job's usage so far (usage and reversals,
    every commit's), its budget the team's open holds per job; a whole ledger's neither."""
    publish = {"balances_topic": "balances", "balances_shard": stamp, "job_usage": bool(stamp)}
    commit(store, a_txn("a", 100), **publish)
    adjusted = a_txn("adj", 7, kind=TransactionKind.ADJUSTMENT)  # not usage: not the job's
    reversal = a_txn("r", -30, kind=TransactionKind.REVERSAL)
    retry = replace(a_hold("job-1", 500), baseline=400, earlier=100)
    holds = StateChanges(holds=[retry, a_hold("job-2", 80, Unit.GPU_MS)])
    txns = (a_txn("b", 50), reversal, adjusted, a_grant("g", 1_000))
    commit(store, *txns, offset=1, changes=holds, **publish)
    sent = {m.key: decode_balance_update(m.value) for m in store.pending_outbox()}
    consumer = sent[balance_key(CONSUMER, stamp)]
    status = sent[balance_key("budget:vision", stamp)].budget
    assert status is not None
    if stamp is None:
        assert (consumer.jobs, status.holds) == ((), None)
        return
    assert consumer.jobs == (JobAmount("job-1", Unit.GPU_MS.value, 100 + 50 - 30),)
    assert status.holds == (
        JobAmount("job-1", Unit.MONEY.value, 500, baseline=400, earlier=100),
        JobAmount("job-2", Unit.GPU_MS.value, 80),
    )


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
