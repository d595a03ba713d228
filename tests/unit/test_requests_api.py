"""`/v1/requests` on the real aiohttp application in-process (the service on the fake executor):
a team lead opens a request, finance approves it, and the admin events the API published, fed
to a real DuckDB ledger, grant the budget once with the approver as actor; the policy's
approvers, 409 for a request no longer open (decided, expired by the clock), 400 for a body
that mixes kinds, 503 while the broker is down; every answer matches the OpenAPI document."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ledger.admin import decode_admin_message
from ledger.admin.request_events import RequestOpened
from ledger.admin.requests import HOUR_US
from ledger.ingest import ConsumedMessage
from ledger.store.hot import DuckDBStore
from ledger.units import Unit
from scheduler.api import Tokens
from tests.unit.test_admin import ingestor
from tests.unit.test_scheduler_api_contract import _document, _validate
from tests.unit.test_scheduler_api_support import ADMIN, LANGUAGE, TOKENS, VISION, Api
from tests.unit.test_scheduler_service_support import Rig, config_data

FINANCE = "finance-token-0123456789abcdef"
OPERATOR = "operator-token-0123456789abcdef"


@pytest.fixture
def api(tmp_path) -> Iterator[Api]:
    from ledger.roles import Caller, Role

    data = config_data(tmp_path)
    data["approvals"] = {"budget": {"finance_over": "1000.00"}, "expire_after_hours": 24}
    rig = Rig(tmp_path, data)
    tokens = Tokens(
        admin=ADMIN,
        teams=TOKENS.teams,
        named={
            **TOKENS.named,
            FINANCE: Caller(Role.FINANCE, label="books"),
            OPERATOR: Caller(Role.OPERATOR, label="ops"),
        },
    )
    instance = Api(rig, tokens=tokens)
    try:
        yield instance
    finally:
        instance.close()


BUDGET = {"kind": "budget", "period": "2026-11", "money": "1500.00", "reason": "sweep"}
QUOTA = {"kind": "quota", "pool": "h100", "model": "H100", "gpus": 4, "reason": "borrow"}


def _open(api: Api, token: str = VISION, **body: object) -> dict[str, object]:
    sent = body if "kind" in body else {**BUDGET, **body}
    status, answer = api.call("POST", "/v1/requests", token, json=sent)
    assert status == 201, answer
    return dict(answer["request"])


def test_a_lead_asks_finance_approves_and_the_ledger_grants_once(api, tmp_path):
    doc = _document(api)
    opened = _open(api)
    assert (opened["status"], opened["approvers"], opened["requested_by"]) == (
        "open",
        ["finance"],  # over the policy's 1000.00
        "team:vision",
    )
    assert opened["change"] == "budget 2026-11 money_micros +1500000000"
    rid = str(opened["request_id"])
    path = f"/v1/requests/{rid}"
    assert api.call("POST", f"{path}/approve", ADMIN, json={"comment": "x"})[0] == 403
    status, answer = api.call("POST", f"{path}/approve", FINANCE, json={"comment": "go"})
    assert status == 200, answer
    approved = answer["request"]
    assert (approved["status"], approved["decided_by"], approved["comment"]) == (
        "approved",
        "finance:books",
        "go",
    )
    again = api.call("POST", f"{path}/reject", FINANCE, json={"comment": "oops"})
    assert again[0] == 409 and "is approved, not open" in again[1]["error"]["message"]
    assert api.call("GET", path, LANGUAGE)[0] == 404  # another team's
    listed = api.call("GET", "/v1/requests?status=approved", VISION)[1]["requests"]
    assert [r["request_id"] for r in listed] == [rid]
    # What the API published, applied by a real ledger: the grant, once, by the approver.
    published = api.rig.publisher.admin_messages
    assert [decode_admin_message(v)[0][0].subject for _, v in published] == [rid, rid]
    messages = [ConsumedMessage("admin", 0, i, v) for i, (_, v) in enumerate(published)]
    with DuckDBStore(tmp_path / "ledger") as store:
        result = ingestor(store).apply(messages + messages)  # and every message redelivered
        assert result.dead_letters == () and result.commit.transactions == 1
        view = store.admin_view()
        assert view.budgets == {("vision", "2026-11", Unit.MONEY): 1_500_000_000}
        assert view.requests[rid].effect == approved["effect"]
        effect = view.requests[rid].effect
        grant = [e.envelope.data for e in store.admin_entries() if e.envelope.id == effect]
        assert grant[0].actor == "finance:books"
    # The feed brings the same messages back: folded once.
    api.rig.requests.on_admin(published[0][1])
    assert api.rig.requests.states[rid].status.value == "approved"
    for method, p, status, body in api.seen:
        _validate(doc, method, p, status, body)


def test_raising_a_borrowing_limit_needs_an_admin(api):
    rid = _open(api, **{**QUOTA, "borrowing_limit": 8})["request_id"]
    path = f"/v1/requests/{rid}/approve"
    refused = api.call("POST", path, OPERATOR, json={"comment": "ok"})
    assert refused[0] == 403 and "needs an admin" in refused[1]["error"]["message"]
    assert api.call("POST", path, ADMIN, json={"comment": "ok"})[0] == 200
    assert api.rig.requests.quotas[("vision", "h100", "H100")].borrowing_limit == 8
    same = _open(api, **{**QUOTA, "borrowing_limit": 8, "gpus": 5, "reason": "more"})
    assert same["approvers"] == ["admin", "operator"]  # no higher than the applied limit


def test_an_open_request_expires_by_the_clock(api):
    rid = _open(api, money="10.00")["request_id"]
    api.rig.clock.advance(24 * HOUR_US)
    shown = api.call("GET", f"/v1/requests/{rid}", ADMIN)[1]["request"]
    assert shown["status"] == "expired"
    late = api.call("POST", f"/v1/requests/{rid}/approve", ADMIN, json={"comment": "late"})
    assert late[0] == 409 and "expired" in late[1]["error"]["message"]


@pytest.mark.parametrize(
    ("body", "status", "text"),
    [
        pytest.param({**BUDGET, "pool": "h100"}, 400, "not part of a budget request", id="mixed"),
        pytest.param({**BUDGET, "money": "1e3"}, 400, "money", id="float-money"),
        pytest.param({**BUDGET, "money": "0"}, 400, "zero", id="zero"),
        pytest.param({**QUOTA, "gpus": None}, 400, "needs pool, model and gpus", id="no-gpus"),
        pytest.param({**BUDGET, "team": "language"}, 404, "no team language", id="other-team"),
        pytest.param({**BUDGET, "extra": 1}, 400, "extra", id="unknown-field"),
    ],
)
def test_a_bad_request_is_refused_and_nothing_is_published(api, body, status, text):
    answer = api.call("POST", "/v1/requests", VISION, json=body)
    assert answer[0] == status and text in answer[1]["error"]["message"], answer
    assert api.rig.publisher.admin_messages == []


def test_a_broker_that_is_down_is_a_503_and_nothing_is_recorded(api):
    api.rig.publisher.fail_next = 1
    status, body = api.call("POST", "/v1/requests", VISION, json=BUDGET)
    assert status == 503 and "broker" in body["error"]["message"]
    assert api.rig.requests.states == {}
    opened = _open(api)  # and the next try goes through
    assert isinstance(
        decode_admin_message(api.rig.publisher.admin_messages[0][1])[0][0].data, RequestOpened
    )
    assert opened["status"] == "open"
