"""The scheduler's request desk learns the ledger's refusals: a decision step the desk let
through but the ledger refused (`tally.request.refused` on the alerts topic, naming the step)
is undone on the desk — the request shows `refused` with the ledger's reason, a quota the
approval set is taken back — whether the refusal is read before or after the step; the API's
view and `tally request list`'s row show the same."""

from __future__ import annotations

import pytest

from ledger.admin import admin_envelope, encode_admin
from ledger.admin.requests import ApprovalPolicy, RequestState, refusal_alert, refused_step
from ledger.fleet_alerts import encode_fleet_alert
from ledger.roles import Role
from scheduler.api.request_handlers import request_view
from scheduler.requests import RequestDesk
from tally.cli.request import request_row
from tests.unit.test_admin import WHEN
from tests.unit.test_requests import BUDGET, QID, QUOTA, RID, approve

REASON = "request …: its change is refused: budget for 2026-11 refused: the period is closed"


def _desk() -> RequestDesk:
    return RequestDesk(ApprovalPolicy(), publisher=None)  # type: ignore[arg-type]  # reads only


def _refusal(step, rid: str) -> bytes:
    """The ledger's `tally.request.refused` for `step` (an admin envelope) of request `rid`."""
    opened = BUDGET if rid == RID else QUOTA
    state = refused_step({rid: RequestState(opened)}, step.data, REASON)
    assert state is not None
    return encode_fleet_alert(refusal_alert(step.data, state, step.id))


CASES = {
    "budget-refusal-after-the-approval": (RID, False),
    "budget-refusal-before-the-approval": (RID, True),
    "quota-refusal-after-the-approval": (QID, False),
    "quota-refusal-before-the-approval": (QID, True),
}


@pytest.mark.parametrize(("rid", "refusal_first"), CASES.values(), ids=CASES.keys())
def test_the_desk_shows_a_refused_approval_as_refused_with_the_reason(rid, refusal_first):
    desk = _desk()
    opened = BUDGET if rid == RID else QUOTA
    step = admin_envelope(approve(rid, actor="root", role=Role.ADMIN))
    desk.on_admin(encode_admin(admin_envelope(opened))[1])
    changes = desk.quota_changes
    if refusal_first:
        desk.on_alert(_refusal(step, rid))
        desk.on_admin(encode_admin(step)[1])
    else:
        desk.on_admin(encode_admin(step)[1])
        assert desk.states[rid].shown_at(WHEN) == "approved"  # the topic says so, for now
        desk.on_alert(_refusal(step, rid))
    state = desk.states[rid]
    assert (state.shown_at(WHEN), state.refused, state.decided_by) == ("refused", REASON, None)
    assert desk.quotas == {}  # an approved quota the ledger refused is not admitted against
    assert desk.quota_changes in (changes, changes + 2)  # set and taken back, or never set
    view = request_view(state, WHEN)
    assert (view.status, view.refused_reason) == ("refused", REASON)
    row = request_row(state, WHEN)
    assert (row["status"], row["refused_reason"]) == ("refused", REASON)
    # Refused steps leave the request open: another approval is checked as on an open one.
    assert desk.refusal(approve(rid, actor="root", role=Role.ADMIN, comment="again")) is None


def test_a_refusal_of_an_older_step_or_garbage_changes_nothing():
    desk = _desk()
    desk.on_admin(encode_admin(admin_envelope(BUDGET))[1])
    step = admin_envelope(approve(RID, actor="root", role=Role.ADMIN))
    desk.on_admin(encode_admin(step)[1])
    desk.on_alert(b"not an alert")
    desk.on_alert(None)
    other = admin_envelope(approve(RID, actor="fran", role=Role.FINANCE))  # never folded here
    desk.on_alert(_refusal(other, RID))
    assert desk.states[RID].shown_at(WHEN) == "approved"
    assert request_view(desk.states[RID], WHEN).refused_reason is None
