"""Quota and budget requests (`ledger.admin.requests`): the approval policy as a table of pure
decisions, the strict codec of the request events, and the admin fold on a real DuckDB ledger:
open → approved → the grant or quota applied exactly once (redelivery and resends idempotent),
rejection, expiry by event time, refusals as dead letters, the audit trail, the alerts in the
outbox, and a rebuild making the same ledger."""

from __future__ import annotations

from dataclasses import replace

import orjson
import pytest

from ledger.admin import PeriodClosed, admin_envelope, admin_envelope_to_dict, decode_admin_message
from ledger.admin.request_events import (
    RequestApproved,
    RequestExpired,
    RequestKind,
    RequestOpened,
    RequestRejected,
    RequestStatus,
)
from ledger.admin.requests import (
    HOUR_US,
    ApprovalPolicy,
    Verdict,
    approvers_for,
    effect_envelope,
    request_id,
    verdict,
)
from ledger.fleet_alerts import FleetKind, RequestAlert, decode_any_alert
from ledger.ingest import InputTopics
from ledger.roles import Role
from ledger.store.hot import DuckDBStore
from ledger.store.memory import MemoryStore
from ledger.store.rebuild import ReplaySettings, rebuild
from ledger.units import Unit
from tests.unit.test_admin import PRICES, WHEN, admin_message, ingestor, store

__all__ = ["store"]


@pytest.fixture
def memory():
    """The in-memory store, for the fold's decisions (the contract suite runs both stores)."""
    with MemoryStore() as s:
        yield s


LEAD = "lena"  # vision's team lead
RID = request_id("vision", RequestKind.BUDGET, LEAD, "more runs", WHEN)
BUDGET = RequestOpened(
    RID,
    "vision",
    RequestKind.BUDGET,
    ("admin", "finance"),
    WHEN + 72 * HOUR_US,
    LEAD,
    "more runs",
    WHEN,
    period="2026-11",
    unit=Unit.MONEY,
    amount=500_000_000,
    role=Role.TEAM_LEAD,
)
QID = request_id("vision", RequestKind.QUOTA, LEAD, "borrow", WHEN)
QUOTA = RequestOpened(
    QID,
    "vision",
    RequestKind.QUOTA,
    ("admin",),
    WHEN + HOUR_US,
    LEAD,
    "borrow",
    WHEN,
    pool="h100",
    model="H100",
    nominal_gpus=8,
    borrowing_limit=4,
    lending_limit=None,
    role=Role.TEAM_LEAD,
)


def approve(rid=RID, actor="fran", role=Role.FINANCE, at=WHEN + HOUR_US // 2, comment="ok"):
    return RequestApproved(rid, actor, comment, at, role)


# ---------------------------------------------------------------------------- the policy

POLICY = ApprovalPolicy(finance_over=1_000_000_000, admin_for_borrowing=True)
LOOSE = ApprovalPolicy(finance_over=1_000_000_000, admin_for_borrowing=False)
M = 1_000_000  # one unit of money in micro-units


def budget(amount: int, unit: Unit = Unit.MONEY) -> RequestOpened:
    return replace(BUDGET, amount=amount, unit=unit)


def quota(borrowing: int | None) -> RequestOpened:
    return replace(QUOTA, borrowing_limit=borrowing)


# (request, policy, the team's borrowing limit now, approver role) → verdict
POLICY_CASES = [
    ("small-budget-finance", budget(999 * M), POLICY, 0, Role.FINANCE, Verdict.ALLOWED),
    ("small-budget-admin", budget(999 * M), POLICY, 0, Role.ADMIN, Verdict.ALLOWED),
    ("at-threshold-admin", budget(1000 * M), POLICY, 0, Role.ADMIN, Verdict.ALLOWED),
    ("over-threshold-finance", budget(1000 * M + 1), POLICY, 0, Role.FINANCE, Verdict.ALLOWED),
    ("over-threshold-admin", budget(1000 * M + 1), POLICY, 0, Role.ADMIN, Verdict.NEEDS_FINANCE),
    ("over-threshold-operator", budget(2000 * M), POLICY, 0, Role.OPERATOR, Verdict.NEEDS_FINANCE),
    ("decrease-admin", budget(-5000 * M), POLICY, 0, Role.ADMIN, Verdict.ALLOWED),
    ("gpu-hours-admin", budget(10**12, Unit.GPU_MS), POLICY, 0, Role.ADMIN, Verdict.ALLOWED),
    ("budget-operator", budget(M), POLICY, 0, Role.OPERATOR, Verdict.NEEDS_ADMIN),
    ("budget-viewer", budget(M), POLICY, 0, Role.VIEWER, Verdict.REFUSED),
    ("budget-team-lead", budget(M), POLICY, 0, Role.TEAM_LEAD, Verdict.REFUSED),
    ("budget-member", budget(M), POLICY, 0, Role.MEMBER, Verdict.REFUSED),
    ("borrow-more-admin", quota(4), POLICY, 2, Role.ADMIN, Verdict.ALLOWED),
    ("borrow-more-operator", quota(4), POLICY, 2, Role.OPERATOR, Verdict.NEEDS_ADMIN),
    ("borrow-more-finance", quota(4), POLICY, 2, Role.FINANCE, Verdict.NEEDS_ADMIN),
    ("borrow-unlimited-operator", quota(None), POLICY, 2, Role.OPERATOR, Verdict.NEEDS_ADMIN),
    ("borrow-same-operator", quota(2), POLICY, 2, Role.OPERATOR, Verdict.ALLOWED),
    ("borrow-less-operator", quota(1), POLICY, 2, Role.OPERATOR, Verdict.ALLOWED),
    ("already-unlimited-operator", quota(None), POLICY, None, Role.OPERATOR, Verdict.ALLOWED),
    ("borrow-more-loose-operator", quota(8), LOOSE, 0, Role.OPERATOR, Verdict.ALLOWED),
    ("quota-viewer", quota(0), POLICY, 0, Role.VIEWER, Verdict.REFUSED),
]


@pytest.mark.parametrize(
    ("opened", "policy", "borrowing", "role", "expected"),
    [pytest.param(*case[1:], id=case[0]) for case in POLICY_CASES],
)
def test_the_policy_names_who_may_approve(opened, policy, borrowing, role, expected):
    recorded = replace(opened, approvers=approvers_for(policy, opened, borrowing))
    assert verdict(recorded, "someone-else", role) is expected


@pytest.mark.parametrize("role", [Role.ADMIN, Role.FINANCE, None], ids=str)
def test_nobody_decides_their_own_request(role):
    assert verdict(BUDGET, LEAD, role) is Verdict.REFUSED
    assert verdict(BUDGET, "fran", role) is Verdict.ALLOWED  # None: the local operator, as admin


def test_a_request_id_derives_from_its_content():
    assert request_id("vision", RequestKind.BUDGET, LEAD, "more runs", WHEN) == RID
    assert RID.startswith("req-") and len(RID) == 20
    assert request_id("vision", RequestKind.BUDGET, LEAD, "more runs", WHEN + 1) != RID


# ---------------------------------------------------------------------------- the codec

STEPS = {
    "opened-budget": BUDGET,
    "opened-quota": QUOTA,
    "approved": approve(),
    "rejected": RequestRejected(RID, "fran", "no", WHEN + 1, Role.FINANCE),
    "expired": RequestExpired(RID, "tally", "expired", WHEN + 80 * HOUR_US),
}


@pytest.mark.parametrize("name", list(STEPS))
def test_request_events_survive_the_wire(name):
    envelope = admin_envelope(STEPS[name])
    (decoded,), dead = decode_admin_message(orjson.dumps(admin_envelope_to_dict(envelope)))
    assert dead == [] and decoded == envelope and decoded.subject == STEPS[name].request_id


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        pytest.param({"amount": None}, "amount: a budget request needs one", id="no-amount"),
        pytest.param({"amount": 0}, "a grant of zero", id="zero"),
        pytest.param({"pool": "h100"}, "pool: not part of a budget request", id="quota-field"),
        pytest.param({"unit": "energy_mj"}, "budgets are in", id="energy"),
        pytest.param({"approvers": []}, "non-empty array of roles", id="no-approvers"),
        pytest.param({"approvers": ["root"]}, "expected one of admin", id="unknown-role"),
        pytest.param({"kind": "gpus"}, "expected one of budget, quota", id="unknown-kind"),
    ],
)
def test_a_malformed_request_is_a_dead_letter(change, reason):
    doc = admin_envelope_to_dict(admin_envelope(BUDGET))
    doc["data"].update(change)
    doc["data"] = {k: v for k, v in doc["data"].items() if v is not None}
    decoded, dead = decode_admin_message(orjson.dumps(doc))
    assert decoded == [] and reason in dead[0].reason


# ---------------------------------------------------------------------------- the fold


def _alerts(store):
    return [decode_any_alert(m.value) for m in store.pending_outbox() if m.topic == "alerts"]


def test_an_approved_budget_request_grants_once_with_the_approver_as_actor(store):
    ing = ingestor(store)
    ing.apply([admin_message(0, BUDGET)])
    assert store.admin_view().requests[RID].status is RequestStatus.OPEN
    assert store.admin_view().budgets == {}
    approval = approve()
    result = ing.apply([admin_message(1, approval)])
    assert result.dead_letters == () and result.commit.transactions == 1
    view = store.admin_view()
    state = view.requests[RID]
    made = effect_envelope(BUDGET, approval)
    assert (state.status, state.decided_by, state.decided_role, state.comment) == (
        RequestStatus.APPROVED,
        "fran",
        "finance",
        "ok",
    )
    assert state.effect == made.id and made.source == "tally://ledger/requests"
    assert view.budgets == {("vision", "2026-11", Unit.MONEY): 500_000_000}
    grant = [e for e in store.admin_entries() if e.envelope.id == made.id]
    assert len(grant) == 1 and grant[0].envelope.data.actor == "fran"
    assert RID in grant[0].envelope.data.reason and grant[0].envelope.data.role is Role.FINANCE
    # Redelivered, resent in a later batch, approved again: nothing moves twice.
    again = ing.apply([admin_message(1, approval)])
    assert again.commit.transactions == 0
    resent = ing.apply([admin_message(2, approval)])
    assert resent.commit.transactions == 0 and resent.dead_letters == ()
    second = ing.apply([admin_message(3, approve(actor="root", role=Role.ADMIN))])
    assert "is approved, not open" in second.dead_letters[0].reason
    assert store.admin_view().budgets == {("vision", "2026-11", Unit.MONEY): 500_000_000}
    # Audit: the request's steps and the grant, in order, with who did them.
    trail = [(r.entry.kind, r.entry.actor, r.entry.role) for r in store.audit_records()]
    assert trail == [
        ("admin.request_opened", LEAD, "team-lead"),
        ("admin.request_approved", "fran", "finance"),
        ("admin.budget_granted", "fran", "finance"),
    ]
    alerts = _alerts(store)
    assert [a.kind for a in alerts] == [FleetKind.REQUEST_OPENED, FleetKind.REQUEST_APPROVED]
    assert all(isinstance(a, RequestAlert) and a.request_id == RID for a in alerts)
    assert alerts[1].change == "budget 2026-11 money_micros +500000000"


def test_open_and_approve_in_one_batch_and_a_quota_request(memory):
    approval = approve(QID, actor="root", role=Role.ADMIN)
    result = ingestor(memory).apply([admin_message(0, QUOTA, approval)])
    assert result.dead_letters == ()
    view = memory.admin_view()
    assert view.requests[QID].status is RequestStatus.APPROVED
    set_quota = view.quotas[("vision", "h100", "H100")]
    assert (set_quota.limits, set_quota.actor) == ((8, 4, None), "root")


REFUSALS = [
    pytest.param([approve(actor=LEAD)], "may not decide request", id="own-request"),
    pytest.param([approve(role=Role.OPERATOR)], "needs an admin", id="operator"),
    pytest.param([approve(at=WHEN + 72 * HOUR_US)], "expired before it was decided", id="too-late"),
    pytest.param([approve(rid="req-0000000000000000")], "no request", id="unknown"),
    pytest.param(
        [RequestExpired(RID, "tally", "sweep", WHEN + HOUR_US)], "expires later", id="early-expiry"
    ),
    pytest.param([replace(BUDGET, reason="again")], "already open", id="opened-twice"),
    pytest.param(
        [replace(approve(), role=Role.TEAM_LEAD)], "may not requests.decide", id="lead-role"
    ),
]


@pytest.mark.parametrize(("steps", "reason"), REFUSALS)
def test_a_step_the_request_does_not_allow_is_a_dead_letter(memory, steps, reason):
    ing = ingestor(memory)
    ing.apply([admin_message(0, BUDGET)])
    result = ing.apply([admin_message(1, *steps)])
    assert len(result.dead_letters) == 1 and reason in result.dead_letters[0].reason
    assert memory.admin_view().requests[RID].status is RequestStatus.OPEN
    assert memory.admin_view().budgets == {}


def test_an_approval_whose_grant_is_refused_leaves_the_request_open_and_says_why(store):
    ing = ingestor(store)
    ing.apply([admin_message(0, BUDGET, PeriodClosed("2026-11", "fran", "close", WHEN))])
    approval = approve()
    result = ing.apply([admin_message(1, approval)])
    reason = result.dead_letters[0].reason
    assert "its change is refused: budget for 2026-11 refused" in reason
    state = store.admin_view().requests[RID]  # folded from the admin log
    assert (state.status, state.shown_at(WHEN), state.refused) == (
        RequestStatus.OPEN,
        "refused",
        reason,
    )
    assert state.shown_at(BUDGET.expires_us) == "expired"
    (refusal,) = [a for a in _alerts(store) if a.kind is FleetKind.REQUEST_REFUSED]
    assert isinstance(refusal, RequestAlert)
    assert (refusal.step, refusal.comment, refusal.actor) == (
        admin_envelope(approval).id,
        reason,
        "fran",
    )
    # A resend is a duplicate (refused and alerted once); a later good decision clears it.
    assert ing.apply([admin_message(2, approval)]).dead_letters == ()
    reject = RequestRejected(RID, "root", "next month", WHEN + 10, Role.ADMIN)
    assert ing.apply([admin_message(3, reject)]).dead_letters == ()
    state = store.admin_view().requests[RID]
    assert (state.shown_at(WHEN), state.refused) == ("rejected", None)
    kinds = [a.kind for a in _alerts(store)]
    assert kinds.count(FleetKind.REQUEST_REFUSED) == 1


def test_rejection_and_expiry_change_nothing_but_the_request(memory):
    ing = ingestor(memory)
    other = replace(BUDGET, request_id="req-1111111111111111")
    ing.apply([admin_message(0, BUDGET, other)])
    reject = RequestRejected(RID, "fran", "not this month", WHEN + 10, Role.FINANCE)
    expire = RequestExpired(other.request_id, "tally", "expired", BUDGET.expires_us)
    result = ing.apply([admin_message(1, reject, expire)])
    assert result.dead_letters == () and result.commit.transactions == 0
    view = memory.admin_view()
    assert view.requests[RID].status is RequestStatus.REJECTED
    assert view.requests[RID].comment == "not this month"
    assert view.requests[other.request_id].status is RequestStatus.EXPIRED
    assert view.budgets == {}
    # A reader sees an open request past its expiry as expired, before any sweep.
    assert view.requests[RID].status_at(BUDGET.expires_us) is RequestStatus.REJECTED
    late = ing.apply([admin_message(2, approve(rid=other.request_id))])
    assert "is expired, not open" in late.dead_letters[0].reason
    kinds = [a.kind for a in _alerts(memory)]
    assert kinds.count(FleetKind.REQUEST_REJECTED) == kinds.count(FleetKind.REQUEST_EXPIRED) == 1


def test_a_rebuild_makes_the_same_requests_grants_and_trail(store, tmp_path):
    ing = ingestor(store)
    ing.apply([admin_message(0, BUDGET, QUOTA)])
    ing.apply([admin_message(1, approve(), approve(QID, actor="root", role=Role.ADMIN))])
    ing.apply([admin_message(2, approve())])  # a resend
    store.seal()
    settings = ReplaySettings(PRICES, {"vision": "research"}, inputs=InputTopics("admin", "jobs"))
    report = rebuild(store.data_dir, tmp_path / "rebuilt", settings)
    assert report.identical, report.differences
    with DuckDBStore(tmp_path / "rebuilt") as rebuilt:
        assert rebuilt.admin_view().requests == store.admin_view().requests
        assert rebuilt.admin_view().budgets == store.admin_view().budgets
        assert rebuilt.audit_records() == store.audit_records()
