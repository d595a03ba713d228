"""The store port's contract for the audit trail (`LedgerStore.audit_records`, `audited_ids`,
`StateChanges.audit`), run against both stores with the `store` fixture of this folder's
`conftest.py` (`tests/contract/test_store_contract.py` also checks a refused commit
appends nothing)."""

from __future__ import annotations

from ledger.audit import AuditEntry, chain, verify_chain
from ledger.store.port import StateChanges, ViewKeys
from tests.builders import T0_US
from tests.contract.store_support import commit


def an_audit_entry(event_id: str, actor: str = "alice") -> AuditEntry:
    return AuditEntry(event_id, T0_US, "admin.price_set", actor, "admin", "cli", "H100")


def test_audit_entries_are_chained_once_each_in_commit_order(store):
    commit(store, changes=StateChanges(audit=[an_audit_entry("e1"), an_audit_entry("e2")]))
    again = [an_audit_entry("e2", "mallory"), an_audit_entry("e3"), an_audit_entry("e3", "x")]
    commit(store, offset=1, changes=StateChanges(audit=again))
    trail = store.audit_records()
    assert [(r.seq, r.entry.event_id, r.entry.actor) for r in trail] == [
        (1, "e1", "alice"),
        (2, "e2", "alice"),  # an event the trail holds is not recorded again
        (3, "e3", "alice"),  # nor one repeated within a batch
    ]
    assert trail == chain(None, [r.entry for r in trail])
    assert verify_chain(trail) is None
    assert store.audited_ids(["e1", "e3", "e9"]) == {"e1", "e3"}
    assert store.load_view(ViewKeys(audit_ids=["e2", "e9"])).audited == frozenset({"e2"})
    store.seal()
    assert store.audit_records() == trail  # never pruned nor sealed away
