"""The store port's contract for job identity (`ledger.job_owners`), against the DuckDB store
(`duckdb`) and the in-memory one (`memory`): job owners committed with their batch (the first
owner of a key stays), suspense transactions awaiting a job key in commit order until resolved,
both read through the one view a batch loads, all or nothing, and for the DuckDB store kept
across a restart."""

from __future__ import annotations

import pytest

from ledger.errors import StoreError
from ledger.events import Owner
from ledger.store.hot import DuckDBStore
from ledger.store.memory import MemoryStore
from ledger.store.port import StateChanges, ViewKeys
from tests.builders import INTERVAL_US, T0_US
from tests.contract.store_support import a_txn, commit

VISION_7 = Owner("vision", "detection", "ada", "job-7")
LANGUAGE_7 = Owner("language", "pretraining", "bob", "job-7")
VISION_8 = Owner("vision", "detection", "ada", "job-8")
END = T0_US + INTERVAL_US


@pytest.fixture(params=["duckdb", "memory"])
def store(request, tmp_path):
    s = DuckDBStore(tmp_path / "ledger") if request.param == "duckdb" else MemoryStore()
    yield s
    s.close()


def identity(store, keys: frozenset[str]) -> tuple[object, ...]:
    view = store.load_view(ViewKeys(job_keys=keys))
    awaiting = {k: tuple(t.txn_id for t in txns) for k, txns in view.awaiting.items()}
    return view.job_owners, awaiting


def test_job_owners_are_read_back_and_a_known_key_keeps_its_first_owner(store):
    commit(store, changes=StateChanges(job_owners={"job-7": VISION_7, "slurm:42": VISION_7}))
    commit(
        store, offset=1, changes=StateChanges(job_owners={"job-7": LANGUAGE_7, "job-8": VISION_8})
    )
    assert store.job_owners({"job-7", "slurm:42", "job-8", "job-9"}) == {
        "job-7": VISION_7,
        "slurm:42": VISION_7,
        "job-8": VISION_8,
    }
    assert store.job_owners(()) == {}
    assert store.load_view(ViewKeys(job_keys=frozenset({"job-8"}))).job_owners == {
        "job-8": VISION_8
    }
    assert store.load_view(ViewKeys()).job_owners == {}


def test_awaiting_transactions_come_in_commit_order_until_resolved(store):
    commit(
        store,
        a_txn("t2"),
        a_txn("t1"),
        changes=StateChanges(
            awaiting=[("job-7", "t2", END), ("job-7", "t1", END), ("job-8", "t1", END)]
        ),
    )
    commit(store, a_txn("t3"), offset=2, changes=StateChanges(awaiting=[("job-7", "t3", END)]))
    keys = frozenset({"job-7", "job-8", "job-9"})
    assert identity(store, keys) == ({}, {"job-7": ("t2", "t1", "t3"), "job-8": ("t1",)})
    assert store.awaiting_owner({"job-8"}) == {"job-8": ("t1",)}
    commit(
        store,
        a_txn("t4"),
        offset=3,
        changes=StateChanges(
            job_owners={"job-7": VISION_7},
            resolved=["t1", "t2"],
            awaiting=[("job-8", "t4", END), ("job-8", "t4", END)],
            reversals=[("t1", "r1")],
        ),
    )
    assert identity(store, keys) == (
        {"job-7": VISION_7},
        {"job-7": ("t3",), "job-8": ("t4",)},
    )
    view = store.load_view(ViewKeys(job_keys=frozenset({"job-7"})))
    assert view.awaiting["job-7"][0] == store.find_transaction("t3")


def test_awaiting_transactions_ending_before_a_key_s_cutoff_are_forgotten(store):
    gpu = "gpu:GPU-1"
    early, late = ("e", T0_US), ("l", T0_US + 2 * INTERVAL_US)
    commit(
        store,
        a_txn("e"),
        a_txn("l"),
        changes=StateChanges(
            awaiting=[(gpu, "e", early[1]), (gpu, "l", late[1]), ("job-7", "e", early[1])]
        ),
    )
    commit(store, offset=2, changes=StateChanges(forget_awaiting={gpu: T0_US + 1}))
    assert store.awaiting_owner({gpu, "job-7"}) == {gpu: ("l",), "job-7": ("e",)}


def test_an_awaiting_id_never_committed_is_no_transaction_of_the_view(store):
    commit(store, a_txn("t1"), changes=StateChanges(awaiting=[("job-7", "ghost", END)]))
    commit(store, offset=1, changes=StateChanges(awaiting=[("job-7", "t1", END)]))
    assert store.awaiting_owner({"job-7"}) == {"job-7": ("ghost", "t1")}
    assert store.awaiting_transactions({"job-7"}) == {"job-7": (store.find_transaction("t1"),)}


def test_the_view_says_which_awaiting_transactions_were_reversed_already(store):
    commit(store, a_txn("t1"), changes=StateChanges(awaiting=[("job-7", "t1", END)]))
    commit(store, offset=1, changes=StateChanges(reversals=[("t1", "admin-reversal")]))
    view = store.load_view(ViewKeys(job_keys=frozenset({"job-7"})))
    assert view.reversed_by == {"t1": "admin-reversal"}


def test_a_failed_commit_changes_no_identity(store):
    commit(store, a_txn("t1"), changes=StateChanges(reversals=[("t1", "r1")]))
    before = identity(store, frozenset({"job-7"}))
    with pytest.raises(StoreError):
        commit(
            store,
            a_txn("t2"),
            offset=1,
            changes=StateChanges(
                job_owners={"job-7": VISION_7},
                awaiting=[("job-7", "t2", END)],
                reversals=[("t1", "r2")],  # t1 is reversed already: the commit is refused
            ),
        )
    assert identity(store, frozenset({"job-7"})) == before == ({}, {})


def test_the_duckdb_store_keeps_identity_across_a_restart(tmp_path):
    with DuckDBStore(tmp_path / "ledger") as store:
        commit(
            store,
            a_txn("t1"),
            changes=StateChanges(job_owners={"job-8": VISION_8}, awaiting=[("job-7", "t1", END)]),
        )
    with DuckDBStore(tmp_path / "ledger") as store:
        assert identity(store, frozenset({"job-7", "job-8"})) == (
            {"job-8": VISION_8},
            {"job-7": ("t1",)},
        )
