"""The store port's contract for the request projection (`LedgerStore.admin_view().requests`,
folded from the admin log): both stores, fed the same request steps through an `Ingestor`, hold
the same requests, the same grants and the same audit trail, and drop a redelivered approval
alike (the `store` fixture of this folder's `conftest.py`)."""

from __future__ import annotations

from ledger.admin.request_events import RequestRejected, RequestStatus
from ledger.roles import Role
from ledger.units import Unit
from tests.unit.test_admin import admin_message, ingestor
from tests.unit.test_requests import BUDGET, QID, QUOTA, RID, approve


def test_requests_fold_into_the_same_projection_in_every_store(store):
    ing = ingestor(store)
    ing.apply([admin_message(0, BUDGET, QUOTA)])
    assert {r: s.status for r, s in store.admin_view().requests.items()} == {
        RID: RequestStatus.OPEN,
        QID: RequestStatus.OPEN,
    }
    reject = RequestRejected(QID, "root", "no borrowing this quarter", BUDGET.effective_us + 5)
    ing.apply([admin_message(1, approve(), reject)])
    ing.apply([admin_message(1, approve(), reject)])  # redelivered
    view = store.admin_view()
    assert view.requests[RID].status is RequestStatus.APPROVED
    assert view.requests[QID].status is RequestStatus.REJECTED
    assert view.requests[QID].decided_role == Role.ADMIN.value  # no role: the local operator
    assert view.budgets == {("vision", "2026-11", Unit.MONEY): 500_000_000}
    assert view.quotas == {}
    kinds = [r.entry.kind for r in store.audit_records()]
    assert kinds == [
        "admin.request_opened",
        "admin.request_opened",
        "admin.request_approved",
        "admin.budget_granted",
        "admin.request_rejected",
    ]
    store.seal()
    assert store.admin_view().requests == view.requests  # sealing loses nothing
