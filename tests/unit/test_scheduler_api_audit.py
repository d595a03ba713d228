"""Who made each write through the scheduler's API, for the audit trail: a submission's and a
cancellation's events name the token that made them (`requested_by`: `admin`, `team:<name>` or
a named token's `<role>:<name>`, never the secret) and the caller's address (`client`), with or
without an idempotency key; a refused write makes no event; where a request came from and who
sent it are not part of what an idempotency key's digest compares."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest

from ledger.job_events import FailReason, JobFailed, JobSubmitted
from scheduler.executors.fake import RUNS_FOREVER
from scheduler.idempotency import request_digest
from scheduler.ports import Work
from scheduler.records import SubmitRequest
from tests.unit.test_scheduler_api_support import (
    ADMIN,
    LANGUAGE,
    MEMBER,
    VIEWER,
    VISION,
    Api,
    a_job,
)
from tests.unit.test_scheduler_service_support import Rig


@pytest.fixture
def api(tmp_path) -> Iterator[Api]:
    rig = Rig(tmp_path)
    rig.executor.default = RUNS_FOREVER
    instance = Api(rig)
    try:
        yield instance
    finally:
        instance.close()


def _submitted(api: Api) -> list[JobSubmitted]:
    return [e for e in api.rig.events() if isinstance(e, JobSubmitted)]


@pytest.mark.parametrize(
    ("token", "body", "headers", "who"),
    [
        pytest.param(VISION, {}, {}, "team:vision", id="team-unkeyed"),
        pytest.param(VISION, {}, {"Idempotency-Key": "k-1"}, "team:vision", id="team-keyed"),
        pytest.param(ADMIN, {"team": "vision"}, {}, "admin", id="admin-for-a-team"),
        pytest.param(MEMBER, {}, {"Idempotency-Key": "k-1"}, "member:ada", id="member-keyed"),
    ],
)
def test_a_submission_names_its_token_and_address(api, token, body, headers, who):
    status, answer = api.call("POST", "/v1/jobs", token, json=a_job(**body), headers=headers)
    assert status == 201, answer
    [event] = _submitted(api)
    assert (event.requested_by, event.client) == (who, "127.0.0.1")
    assert token not in repr(event)  # the token's name, never its secret


@pytest.mark.parametrize(
    ("token", "who"), [(ADMIN, "admin"), (MEMBER, "member:ada")], ids=["admin", "member"]
)
def test_a_cancel_names_its_token_and_address(api, token, who):
    job = api.submit(VISION)  # ada's (a_job's user)
    status, answer = api.call("POST", f"/v1/jobs/{job}/cancel", token)
    assert status == 200, answer
    [failed] = [e for e in api.rig.events() if isinstance(e, JobFailed)]
    assert failed.reason is FailReason.CANCELLED and failed.idempotency_key is None
    assert (failed.requested_by, failed.client) == (who, "127.0.0.1")


def test_a_refused_write_makes_no_event(api):
    status, _ = api.call("POST", "/v1/jobs", LANGUAGE, json=a_job(team="vision"))
    assert status == 404  # another team's: as if there were no such team
    status, _ = api.call("POST", "/v1/jobs", VIEWER, json=a_job(team="vision"))
    assert status == 403  # a viewer submits nothing
    status, _ = api.call("POST", "/v1/jobs", "not-a-token", json=a_job())
    assert status == 401
    assert _submitted(api) == []


def test_where_a_request_came_from_is_not_in_its_digest():
    request = SubmitRequest("vision", "detection", "ada", "dev", 1, Work(command=("true",)))
    here, there = replace(request, client="10.0.0.1"), replace(request, client="10.0.0.2")
    assert request_digest(here) == request_digest(there) == request_digest(request)
    assert request_digest(replace(request, caller="member:ada")) == request_digest(request)
    assert request_digest(replace(request, gpus=2)) != request_digest(request)
