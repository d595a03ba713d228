"""The dashboard's requests calls (`dashboard.portal_api.PortalClient`) against the scheduler's
real API on loopback (`tests.api_server`): a team lead files a budget request, sees only their
team's, a role the permission table or the policy refuses gets the API's reason as it is (what
the Requests page shows), an admin approves, and a request no longer open says so."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dashboard.portal_api import PortalClient, PortalError
from dashboard.requests_view import RequestForm, request_body, request_rows
from tests.api_server import ApiServer
from tests.unit.test_scheduler_api_support import ADMIN, LANGUAGE, MEMBER, VIEWER, VISION


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    with ApiServer(tmp_path_factory.mktemp("api")) as server:
        yield server


def test_file_read_refuse_and_approve_a_request_as_the_page_does(api):
    lead, member = PortalClient(api.url, VISION), PortalClient(api.url, MEMBER)
    body = request_body(
        RequestForm("budget", "vision", "a bigger sweep", period="2026-12", amount="250.50")
    )
    assert isinstance(body, dict)
    opened = lead.open_request(body)
    assert (opened["status"], opened["requested_by"]) == ("open", "team:vision")
    assert opened["approvers"] == ["admin", "finance"]
    other = PortalClient(api.url, LANGUAGE).requests()
    assert opened["request_id"] not in [r["request_id"] for r in other]  # another team's
    (row,) = [r for r in request_rows(member.requests()) if r.request_id == opened["request_id"]]
    assert (row.status, row.change, row.decidable) == ("pending", "budget 2026-12 +250.5", True)

    with pytest.raises(PortalError, match=r"refused \(403\): .*requests.decide"):
        PortalClient(api.url, VIEWER).decide(opened["request_id"], True, "looks fine")
    with pytest.raises(PortalError, match=r"refused \(403\)"):
        lead.decide(opened["request_id"], True, "my own")  # a team lead decides nothing

    done = PortalClient(api.url, ADMIN).decide(opened["request_id"], True, "within plan")
    assert (done["status"], done["decided_by"], done["comment"]) == (
        "approved",
        "admin",
        "within plan",
    )
    assert done["effect"]  # the admin event the approval became
    (row,) = [r for r in request_rows(lead.requests()) if r.request_id == opened["request_id"]]
    assert (row.status, row.effect, row.decidable) == ("approved", done["effect"], False)
    with pytest.raises(PortalError, match=r"refused \(409\): .*is approved, not open"):
        PortalClient(api.url, ADMIN).decide(opened["request_id"], False, "too late")


def test_a_request_the_api_refuses_for_its_team_says_why(api):
    body = request_body(RequestForm("quota", "nowhere", "x", pool="h100", model="H100", gpus=2))
    assert isinstance(body, dict)
    with pytest.raises(PortalError, match=r"refused \(422\): unknown team 'nowhere'"):
        PortalClient(api.url, ADMIN).open_request(body)
    with pytest.raises(PortalError, match=r"refused \(404\)"):
        PortalClient(api.url, VISION).open_request(body | {"team": "language"})
