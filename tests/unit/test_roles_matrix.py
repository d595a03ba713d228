"""Every role × every API action, against the real aiohttp application in-process (one server
for the module): allowed (2xx), refused (403) and another team's object (404, the answer for
one that does not exist). The expectations are written out here, independently of the
permission table in `ledger.roles`, so a change to the table that these do not share fails."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from ledger.roles import Caller, Role
from scheduler.api import Tokens
from scheduler.executors.fake import RUNS_FOREVER
from tests.unit.test_scheduler_api_support import Api, a_job
from tests.unit.test_scheduler_service_support import Rig

TOKENS = {
    Role.ADMIN: "matrix-admin-0123456789",
    Role.FINANCE: "matrix-finance-0123456789",
    Role.OPERATOR: "matrix-operator-0123456789",
    Role.VIEWER: "matrix-viewer-0123456789",
    Role.TEAM_LEAD: "matrix-lead-vision-0123456789",  # vision's team token
    Role.MEMBER: "matrix-member-vision-ada-0123456789",
}
MEMBER = Caller(Role.MEMBER, "vision", "ada", "ada")
ORG_WIDE = (Role.FINANCE, Role.OPERATOR, Role.VIEWER)

# The objects a case acts on: the member's own job, a teammate's, another team's.
OWNERS = {
    "mine": ("vision", "ada"),
    "teammate": ("vision", "bob"),
    "other-team": ("language", "cy"),
}


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    rig = Rig(tmp_path_factory.mktemp("roles"))
    rig.executor.default = RUNS_FOREVER
    named = {TOKENS[r]: Caller(r, label=r.value) for r in ORG_WIDE}
    tokens = Tokens(
        admin=TOKENS[Role.ADMIN],
        teams={"vision": TOKENS[Role.TEAM_LEAD]},
        named={**named, TOKENS[Role.MEMBER]: MEMBER},
    )
    instance = Api(rig, tokens=tokens)
    try:
        yield instance
    finally:
        instance.close()


def _job_of(api: Api, owner: str) -> str:
    """A fresh pending job of `owner` (see OWNERS), submitted with the admin's token."""
    team, user = OWNERS[owner]
    project = "detection" if team == "vision" else "pretraining"
    return api.submit(TOKENS[Role.ADMIN], team=team, user=user, project=project)


def _submit(owner: str) -> dict[str, Any]:
    team, user = OWNERS[owner]
    project = "detection" if team == "vision" else "pretraining"
    return a_job(team=team, user=user, project=project)


# action id → (method, path, the owner of the object it acts on, None: no object)
ACTIONS: dict[str, tuple[str, str, str | None]] = {
    "submit-mine": ("POST", "/v1/jobs", "mine"),
    "submit-teammate": ("POST", "/v1/jobs", "teammate"),
    "submit-other-team": ("POST", "/v1/jobs", "other-team"),
    "list": ("GET", "/v1/jobs", None),
    "list-own-team": ("GET", "/v1/jobs?team=vision", None),
    "list-other-team": ("GET", "/v1/jobs?team=language", None),
    "show-mine": ("GET", "/v1/jobs/{job}", "mine"),
    "show-teammate": ("GET", "/v1/jobs/{job}", "teammate"),
    "show-other-team": ("GET", "/v1/jobs/{job}", "other-team"),
    "explain-mine": ("GET", "/v1/jobs/{job}/explain", "mine"),
    "explain-teammate": ("GET", "/v1/jobs/{job}/explain", "teammate"),
    "explain-other-team": ("GET", "/v1/jobs/{job}/explain", "other-team"),
    "cancel-mine": ("POST", "/v1/jobs/{job}/cancel", "mine"),
    "cancel-teammate": ("POST", "/v1/jobs/{job}/cancel", "teammate"),
    "cancel-other-team": ("DELETE", "/v1/jobs/{job}", "other-team"),
    "queues": ("GET", "/v1/queues", None),
    "balances": ("GET", "/v1/balances", None),
    "balances-own-team": ("GET", "/v1/balances?team=vision", None),
    "balances-other-team": ("GET", "/v1/balances?team=language", None),
    "inventory": ("GET", "/v1/inventory", None),
    "request-own-team": ("POST", "/v1/requests", "mine"),
    "request-other-team": ("POST", "/v1/requests", "other-team"),
    "requests": ("GET", "/v1/requests", None),
    "requests-own-team": ("GET", "/v1/requests?team=vision", None),
    "requests-other-team": ("GET", "/v1/requests?team=language", None),
    "show-request-own-team": ("GET", "/v1/requests/{request}", "mine"),
    "show-request-other-team": ("GET", "/v1/requests/{request}", "other-team"),
    "approve-request": ("POST", "/v1/requests/{request}/approve", "mine"),
    "approve-other-teams-request": ("POST", "/v1/requests/{request}/approve", "other-team"),
    "reject-request": ("POST", "/v1/requests/{request}/reject", "mine"),
}

# The expected status per action, for the roles in the order of COLUMNS.
COLUMNS = (Role.ADMIN, Role.FINANCE, Role.OPERATOR, Role.VIEWER, Role.TEAM_LEAD, Role.MEMBER)
EXPECTED: dict[str, tuple[int, ...]] = {
    #                       admin finance operator viewer lead member
    "submit-mine":          (201, 403, 403, 403, 201, 201),
    "submit-teammate":      (201, 403, 403, 403, 201, 403),
    "submit-other-team":    (201, 403, 403, 403, 404, 404),
    "list":                 (200, 200, 200, 200, 200, 200),
    "list-own-team":        (200, 200, 200, 200, 200, 200),
    "list-other-team":      (200, 200, 200, 200, 404, 404),
    "show-mine":            (200, 200, 200, 200, 200, 200),
    "show-teammate":        (200, 200, 200, 200, 200, 200),
    "show-other-team":      (200, 200, 200, 200, 404, 404),
    "explain-mine":         (200, 200, 200, 200, 200, 200),
    "explain-teammate":     (200, 200, 200, 200, 200, 200),
    "explain-other-team":   (200, 200, 200, 200, 404, 404),
    "cancel-mine":          (200, 403, 403, 403, 200, 200),
    "cancel-teammate":      (200, 403, 403, 403, 200, 403),
    "cancel-other-team":    (200, 403, 403, 403, 404, 404),
    "queues":               (200, 200, 200, 200, 200, 200),
    "balances":             (200, 200, 403, 200, 200, 200),
    "balances-own-team":    (200, 200, 403, 200, 200, 200),
    "balances-other-team":  (200, 200, 403, 200, 404, 404),
    "inventory":            (200, 200, 200, 200, 200, 200),
    # requests: a budget request, which finance or an admin approves (the operator's role may
    # decide requests, this one's policy says not: 403)
    "request-own-team":     (201, 403, 403, 403, 201, 201),
    "request-other-team":   (201, 403, 403, 403, 404, 404),
    "requests":             (200, 200, 200, 200, 200, 200),
    "requests-own-team":    (200, 200, 200, 200, 200, 200),
    "requests-other-team":  (200, 200, 200, 200, 404, 404),
    "show-request-own-team":   (200, 200, 200, 200, 200, 200),
    "show-request-other-team": (200, 200, 200, 200, 404, 404),
    "approve-request":      (200, 200, 403, 403, 403, 403),
    "approve-other-teams-request": (403, 200, 403, 403, 403, 403),  # the admin opened it
    "reject-request":       (200, 200, 403, 403, 403, 403),
}  # fmt: skip

CASES = [
    pytest.param(role, action, EXPECTED[action][i], id=f"{role}-{action}-{EXPECTED[action][i]}")
    for action in ACTIONS
    for i, role in enumerate(COLUMNS)
]


def test_the_matrix_covers_every_route_and_role():
    from scheduler.api.routes import ROUTES

    assert set(EXPECTED) == set(ACTIONS)
    tried = {
        (
            method,
            path.split("?")[0].replace("{job}", "{job_id}").replace("{request}", "{request_id}"),
        )
        for method, path, _ in ACTIONS.values()
    }
    guarded = {(r.method, r.path) for r in ROUTES if r.token}
    assert guarded <= tried
    assert len(CASES) == len(ACTIONS) * len(Role)


_asked = iter(range(1_000_000))


def _request_body(owner: str) -> dict[str, Any]:
    team, _ = OWNERS[owner]
    reason = f"more runs {next(_asked)}"  # a new request each time
    return {"kind": "budget", "team": team, "period": "2026-11", "money": "10.00", "reason": reason}


def _request_of(api: Api, owner: str) -> str:
    """A fresh open request of `owner`'s team: vision's opened by its lead, language's by the
    admin (who then may not decide it: nobody decides their own request)."""
    team, _ = OWNERS[owner]
    token = TOKENS[Role.TEAM_LEAD] if team == "vision" else TOKENS[Role.ADMIN]
    status, body = api.call("POST", "/v1/requests", token, json=_request_body(owner))
    assert status == 201, body
    return str(body["request"]["request_id"])


def _requests_case(api: Api, role: Role, action: str, expected: int) -> None:
    method, template, owner = ACTIONS[action]
    token = TOKENS[role]
    if method == "POST" and "{request}" not in template:
        assert owner is not None
        status, body = api.call(method, template, token, json=_request_body(owner))
        assert status == expected, body
        if status == 201:
            assert body["request"]["status"] == "open"
            assert body["request"]["requested_by"] == api_name(role)
        return
    request = _request_of(api, owner) if owner is not None else None
    json = {"comment": "fine"} if method == "POST" else None
    status, body = api.call(method, template.format(request=request), token, json=json)
    assert status == expected, body
    if status == 404 and request is not None:
        assert body["error"]["message"] == f"no request {request}"
    if status == 403 and not action.startswith(("approve", "reject")):
        assert body["error"]["message"].startswith(f"role {role} may")
    if status == 200 and role.per_team and action.startswith("requests"):
        assert {r["team"] for r in body["requests"]} <= {"vision"}
    if status == 200 and action.startswith(("approve", "reject")):
        assert body["request"]["status"] == action.split("-", maxsplit=1)[0].rstrip("e") + "ed"
        assert body["request"]["decided_by"] == api_name(role)


def api_name(role: Role) -> str:
    return {Role.ADMIN: "admin", Role.TEAM_LEAD: "team:vision", Role.MEMBER: "member:ada"}.get(
        role, f"{role}:{role}"
    )


@pytest.mark.parametrize(("role", "action", "expected"), CASES)
def test_a_role_may_do_what_the_table_says_and_nothing_more(api, role, action, expected):
    method, template, owner = ACTIONS[action]
    token = TOKENS[role]
    if template.startswith("/v1/requests"):
        _requests_case(api, role, action, expected)
        return
    if template.startswith("/v1/jobs") and method == "POST" and "{job}" not in template:
        assert owner is not None
        before = len(api.rig.dispatcher.records)
        status, body = api.call(method, template, token, json=_submit(owner))
        assert status == expected, body
        assert len(api.rig.dispatcher.records) == before + (status == 201)
        return
    job = _job_of(api, owner) if owner is not None else None
    status, body = api.call(method, template.format(job=job), token)
    assert status == expected, body
    if status == 404:  # the same answer as for what does not exist: nothing leaks
        assert body["error"]["code"] == "not_found"
        if job is not None:
            assert body["error"]["message"] == f"no job {job}"
    if status == 403:
        assert body["error"]["message"].startswith(f"role {role} may")
    if job is not None and action.startswith("cancel"):
        state = api.rig.dispatcher.records[job].state.value
        assert (state == "cancelled") == (status == 200), state
    if status == 200 and role.per_team and action.startswith(("list", "balances")):
        rows = body.get("jobs", body.get("balances"))
        assert rows and {row["team"] for row in rows} == {"vision"}
