"""The ledger store port's contract (`ledger.store.port.LedgerStore`), second part, against the
DuckDB store (`duckdb`) and the in-memory one (`memory`): pruning and sealing, a commit's
atomicity, the ingestor on the store, and at the end tests that feed both stores the same
batches and compare what only both together can show (checksums, balance messages). The
first part is `test_store_contract.py`; the fixture and builders are in `store_support.py`."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ledger.balances import decode_balance_update
from ledger.events import DeadLetter, encode_batch
from ledger.ingest import Ingestor
from ledger.postings import Posting, Transaction
from ledger.pricing import Price, PriceBook
from ledger.store.port import (
    ConsumedMessage,
    StateChanges,
    ViewKeys,
)
from ledger.units import Unit
from tests.builders import INTERVAL_US, T0_US, a_process, an_envelope, an_owner
from tests.contract.store_support import (
    CAPACITY,
    CONSUMER,
    DEC_US,
    INC,
    NOV,
    TOPIC,
    a_grant,
    a_hold,
    a_txn,
    an_idle_state,
    both_stores,
    closing,
    commit,
    message,
    observable,
)

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
            changes=StateChanges(
                holds=[a_hold()],
                baselines={("job-1", Unit.MONEY): 400},
                seen=[("seen-1", T0_US, "assign:GPU-1")],
            ),
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
