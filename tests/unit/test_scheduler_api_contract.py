"""The scheduler API against its own contract, over a real aiohttp server: the OpenAPI document
lists exactly the live routes and every answer of a run validates against it; pagination,
filters and cursors of `GET /v1/jobs`; RFC 3339 times; per-queue priority bounds; the access
log."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import quote

import pytest
from jsonschema import Draft202012Validator

from ledger.inventory import encode_record
from scheduler.api.app import printable
from scheduler.api.views import EPOCH
from scheduler.executors.fake import RUNS_FOREVER
from scheduler.inventory import FleetInventory
from scheduler.ports import Work
from scheduler.records import SubmitRequest
from tally.config import ConfigError, parse_config
from tests.inventory_builders import a_mig_slice, a_record
from tests.unit.test_scheduler_api_support import ADMIN, LANGUAGE, VIEWER, VISION, Api, a_job
from tests.unit.test_scheduler_service_support import Rig, config_data


@pytest.fixture
def api(tmp_path) -> Iterator[Api]:
    rig = Rig(tmp_path)
    rig.executor.default = RUNS_FOREVER
    instance = Api(rig)
    try:
        yield instance
    finally:
        instance.close()


def _document(api: Api) -> dict[str, Any]:
    status, doc = api.call("GET", "/v1/openapi.json")
    assert status == 200
    return dict(doc)


def _template(doc: dict[str, Any], path: str) -> str | None:
    for template in doc["paths"]:
        pattern = "^" + re.sub(r"\\\{[a-z_]+\\\}", "[^/]+", re.escape(template)) + "$"
        if re.match(pattern, path):
            return str(template)
    return None


# ---------------------------------------------------------------------------- the document


def test_the_document_lists_exactly_the_live_routes(api):
    doc = _document(api)
    assert doc["openapi"] == "3.1.0"
    live = {(r.method, r.resource.canonical) for r in api.server.app.router.routes()}
    documented = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
    assert documented == live
    assert ("GET", "/v1/openapi.json") in live and len(live) == 16  # 11 + 5 of /v1/requests
    for schema in doc["components"]["schemas"].values():
        Draft202012Validator.check_schema(schema)
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            assert op["responses"], (method, path)
            secured = op["security"] != []
            assert secured == (path not in ("/v1/health", "/v1/openapi.json")), path
            for answer in op["responses"].values():
                for media in answer["content"].values():
                    ref = media["schema"].get("$ref")
                    assert ref is None or ref.split("/")[-1] in doc["components"]["schemas"]


def _validate(doc: dict[str, Any], method: str, path: str, status: int, body: Any) -> str:
    template = _template(doc, path)
    assert template is not None, path
    operation = doc["paths"][template].get(method.lower())
    if operation is None:  # a method the path does not have
        assert status == 405, (method, path, status)
        schema = {"$ref": "#/components/schemas/ErrorBody"}
        Draft202012Validator({**schema, "components": doc["components"]}).validate(body)
        return template
    responses = operation["responses"]
    assert str(status) in responses, (method, path, status, body)
    schema = responses[str(status)]["content"]["application/json"]["schema"]
    Draft202012Validator({**schema, "components": doc["components"]}).validate(body)
    return template


REQUEST = {"kind": "budget", "period": "2026-11", "money": "5.00"}
COMMENT = {"comment": "ok"}


def test_every_answer_of_a_run_matches_the_document(api):
    doc = _document(api)
    jobs = [api.submit(VISION), api.submit(LANGUAGE, project="pretraining")]
    jobs += [api.submit(VISION), api.submit(VISION)]  # cancelled while the broker is down
    key = {"Idempotency-Key": "contract-1"}
    api.call("POST", "/v1/jobs", VISION, json=a_job(gpus=2), headers=key)
    api.call("POST", "/v1/jobs", VISION, json=a_job(gpus=2), headers=key)  # 200: a repeat
    api.tick()
    api.call("GET", "/v1/health")
    api.call("GET", "/v1/jobs?limit=1", ADMIN)
    api.call("GET", f"/v1/jobs/{jobs[0]}", VISION)
    api.call("GET", f"/v1/jobs/{jobs[0]}/explain", VISION)
    api.call("GET", "/v1/queues", VISION)
    api.call("GET", "/v1/balances", ADMIN)
    api.rig.service.inventory = FleetInventory(6)
    api.rig.service.inventory.on_record(encode_record(a_record(mig=(a_mig_slice(),))))
    api.call("GET", "/v1/inventory?pool=h100", VISION)
    api.call("POST", f"/v1/jobs/{jobs[0]}/cancel", VISION)
    api.call("DELETE", f"/v1/jobs/{jobs[1]}", ADMIN)
    asked = [
        api.call("POST", "/v1/requests", VISION, json=REQUEST | {"reason": r})[1]["request"]
        for r in ("one", "two")
    ]
    api.call("GET", "/v1/requests?status=open", VISION)
    api.call("GET", f"/v1/requests/{asked[0]['request_id']}", ADMIN)
    for request, step in zip(asked, ("approve", "reject"), strict=True):
        api.call("POST", f"/v1/requests/{request['request_id']}/{step}", ADMIN, json=COMMENT)
    api.call("POST", f"/v1/requests/{asked[0]['request_id']}/reject", ADMIN, json=COMMENT)  # 409
    for method, path, token, body in (
        ("GET", "/v1/jobs", None, None),  # 401
        ("GET", "/v1/jobs?team=language", VISION, None),  # 404: another team
        ("POST", "/v1/jobs", VIEWER, a_job(team="vision")),  # 403: a viewer submits nothing
        ("GET", "/v1/jobs?limit=0", VISION, None),  # 400
        ("GET", "/v1/jobs/job-nope", VISION, None),  # 404
        ("PUT", "/v1/jobs", VISION, a_job()),  # 405
        ("POST", f"/v1/jobs/{jobs[0]}/cancel", VISION, None),  # 409
        ("POST", "/v1/jobs", VISION, a_job(queue="nope")),  # 422
        ("POST", "/v1/jobs", VISION, a_job(command=["x" * 5000])),  # 413
    ):
        api.call(method, path, token, json=body)
    api.call("POST", "/v1/jobs", VISION, data=b"{}", headers={"Content-Type": "text/csv"})  # 415
    api.rig.service.publish_timeout_s = 0.05
    api.rig.publisher.fail_next = 10**6
    api.call("POST", "/v1/jobs", VISION, json=a_job())  # 202
    api.call("POST", f"/v1/jobs/{jobs[2]}/cancel", VISION)  # 202
    api.call("DELETE", f"/v1/jobs/{jobs[3]}", VISION)  # 202
    api.rig.publisher.fail_next = 0

    covered = set()
    for method, path, status, body in api.seen:
        covered.add((method, _validate(doc, method, path, status, body), status))
    for template, ops in doc["paths"].items():
        for method, op in ops.items():
            for status in op["responses"]:
                if status.startswith("2"):
                    assert (method.upper(), template, int(status)) in covered, (method, template)
    statuses = {status for _, _, status, _ in api.seen}
    assert {400, 401, 403, 404, 405, 409, 413, 415, 422} <= statuses


def test_a_wrong_answer_would_fail_the_check(api):
    doc = _document(api)
    job = api.submit(VISION)
    status, body = api.call("GET", f"/v1/jobs/{job}", VISION)
    body["job"]["gpus"] = "one"
    with pytest.raises(Exception, match="is not of type 'integer'"):
        _validate(doc, "GET", f"/v1/jobs/{job}", status, body)
    del body["job"]["gpus"]
    with pytest.raises(Exception, match="'gpus' is a required property"):
        _validate(doc, "GET", f"/v1/jobs/{job}", status, body)


# ---------------------------------------------------------------------------- pages


def _all_pages(api: Api, token: str, query: str, limit: int) -> tuple[list[str], int]:
    ids: list[str] = []
    pages = 0
    cursor = None
    while True:
        extra = "" if cursor is None else f"&cursor={quote(cursor)}"
        status, body = api.call("GET", f"/v1/jobs?limit={limit}{query}{extra}", token)
        assert status == 200, body
        assert len(body["jobs"]) <= limit
        ids.extend(j["job_id"] for j in body["jobs"])
        pages += 1
        cursor = body["next_cursor"]
        if cursor is None:
            return ids, pages


def test_pages_continue_exactly_where_the_last_one_ended(api):
    submitted = []
    for i in range(7):
        if i % 3 == 2:
            submitted.append(api.submit(LANGUAGE, project="pretraining", user=f"u{i % 2}"))
        else:
            submitted.append(api.submit(VISION, user=f"u{i % 2}"))
        api.rig.clock.advance(1_000_000)
    ids, pages = _all_pages(api, ADMIN, "", 3)
    assert (ids, pages) == (submitted, 3)
    mine, _ = _all_pages(api, VISION, "", 2)
    assert mine == [j for i, j in enumerate(submitted) if i % 3 != 2]
    # a job submitted between pages comes after every listed job
    _, first = api.call("GET", "/v1/jobs?limit=4", ADMIN)
    late = api.submit(VISION)
    _, rest = api.call("GET", f"/v1/jobs?cursor={quote(first['next_cursor'])}", ADMIN)
    assert [j["job_id"] for j in first["jobs"] + rest["jobs"]] == [*submitted, late]
    assert rest["next_cursor"] is None


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("&user=u1", lambda i: i % 2 == 1),
        ("&queue=train", lambda i: i >= 4),
        ("&state=pending&queue=dev", lambda i: i < 4),
        ("&since=2026-11-01T00:00:03Z", lambda i: i >= 3),
        ("&since=1793491203000000", lambda i: i >= 3),
        ("&since=2026-11-01T01:00:03%2B01:00", lambda i: i >= 3),
        ("&team=language", lambda i: False),
    ],
    ids=["user", "queue", "state-and-queue", "since-rfc3339", "since-us", "since-offset", "team"],
)
def test_filters_choose_the_jobs_and_survive_paging(api, query, expected):
    submitted = []
    for i in range(6):
        queue = "train" if i >= 4 else "dev"
        submitted.append(api.submit(VISION, user=f"u{i % 2}", queue=queue))
        api.rig.clock.advance(1_000_000)
    ids, _ = _all_pages(api, ADMIN, query, 2)
    assert ids == [j for i, j in enumerate(submitted) if expected(i)]


def test_a_cursor_works_only_for_its_query_and_caller(api):
    for _ in range(3):
        api.submit(VISION)
    status, body = api.call("GET", "/v1/jobs?limit=1", VISION)
    cursor = body["next_cursor"]
    payload, _, mac = cursor.partition(".")
    tampered = payload[:-1] + ("A" if payload[-1] != "A" else "B") + "." + mac
    for token, query in (
        (VISION, f"cursor={quote(tampered)}"),
        (VISION, f"cursor={quote(cursor + 'x')}"),
        (VISION, f"cursor={quote(cursor)}&state=running"),
        (ADMIN, f"cursor={quote(cursor)}"),
        (VISION, "cursor=not-a-cursor"),
    ):
        status, body = api.call("GET", f"/v1/jobs?limit=1&{query}", token)
        assert (status, body["error"]["code"]) == (400, "bad_request"), query
        assert "cursor: not valid" in body["error"]["message"]
    assert api.call("GET", f"/v1/jobs?limit=1&cursor={quote(cursor)}", VISION)[0] == 200


@pytest.mark.parametrize(
    ("query", "text"),
    [
        ("limit=0", "limit"),
        ("limit=1001", "limit"),
        ("limit=ten", "limit"),
        ("since=yesterday", "since: expected RFC 3339"),
        ("since=2026-11-01T00:00:00", "since: give a time zone"),
        ("since=99999999999999999", "since: out of range"),
        ("colour=blue", "unknown fields: colour"),
        ("state=running&state=pending", "given more than once: state"),
        ("queue=..%2F..", "queue"),
    ],
    ids=["limit-0", "limit-over-max", "limit-text", "since-words", "since-naive",
         "since-huge", "unknown-param", "repeated-param", "bad-queue-name"],
)  # fmt: skip
def test_bad_list_queries_are_400_with_the_reason(api, query, text):
    status, body = api.call("GET", f"/v1/jobs?{query}", VISION)
    assert status == 400 and text in body["error"]["message"], body


def test_the_default_page_is_100_and_the_largest_1000(api):
    for _ in range(101):
        api.rig.dispatcher.submit(
            SubmitRequest("vision", "detection", "ada", "dev", 1, Work(command=("true",)))
        )
    _, body = api.call("GET", "/v1/jobs", VISION)
    assert len(body["jobs"]) == 100 and body["next_cursor"] is not None
    _, body = api.call("GET", "/v1/jobs?limit=1000", VISION)
    assert len(body["jobs"]) == 101 and body["next_cursor"] is None


# ---------------------------------------------------------------------------- times


def test_times_are_given_as_microseconds_and_rfc3339(api):
    job = api.submit(VISION)
    api.tick()
    _, body = api.call("GET", f"/v1/jobs/{job}", VISION)
    view = body["job"]
    assert (view["submitted_us"], view["submitted_at"]) == (
        1_793_491_200_000_000,
        "2026-11-01T00:00:00.000000Z",
    )
    for name in ("submitted", "admitted"):
        at = datetime.fromisoformat(view[f"{name}_at"])
        assert at.utcoffset() is not None and at.utcoffset().total_seconds() == 0
        assert (at - EPOCH) // timedelta(microseconds=1) == view[f"{name}_us"]
    assert view["admitted_at"] != view["submitted_at"]
    assert (view["ended_us"], view["ended_at"]) == (None, None)


# ---------------------------------------------------------------------------- priority bounds


@pytest.mark.parametrize(
    ("token", "priority", "status"),
    [(VISION, 100, 201), (VISION, 0, 201), (VISION, 101, 403), (VISION, -1, 403),
     (ADMIN, 5000, 201), (ADMIN, -5000, 201), (VISION, None, 201)],
    ids=["team-at-max", "team-at-min", "team-above", "team-below", "admin-above",
         "admin-below", "team-queue-default"],
)  # fmt: skip
def test_a_teams_token_stays_within_its_queues_priority_bounds(api, token, priority, status):
    body = a_job(priority=priority) if priority is not None else a_job()
    if token == ADMIN:
        body["team"] = "vision"
    before = len(api.rig.events())
    got, answer = api.call("POST", "/v1/jobs", token, json=body)
    assert got == status, answer
    if status == 403:
        assert answer["error"]["code"] == "forbidden"
        assert "outside queue dev's bounds [0, 100]" in answer["error"]["message"]
        assert len(api.rig.events()) == before
    else:
        assert answer["job"]["priority"] == priority


def test_priority_bounds_come_from_the_queue_config_and_are_shown(tmp_path):
    data = config_data(tmp_path)
    data["queues"][0]["priority_bounds"] = {"min": -10, "max": 10}
    rig = Rig(tmp_path, data)
    api = Api(rig)
    try:
        assert api.call("POST", "/v1/jobs", VISION, json=a_job(priority=-10))[0] == 201
        assert api.call("POST", "/v1/jobs", VISION, json=a_job(priority=11))[0] == 403
        _, body = api.call("GET", "/v1/queues", VISION)
        bounds = {q["name"]: q["priority_bounds"] for q in body["queues"]}
        assert bounds == {
            "dev": {"min": -10, "max": 10},
            "train": {"min": 0, "max": 100},
            "serve": {"min": 0, "max": 100},
        }
    finally:
        api.close()


def test_priority_bounds_must_be_ordered(tmp_path):
    data = config_data(tmp_path)
    data["queues"][0]["priority_bounds"] = {"min": 5, "max": 1}
    with pytest.raises(
        ConfigError, match=r"queues\[0\]\.priority_bounds: min \(5\) is above max \(1\)"
    ):
        parse_config(data, "test.yaml")


# ---------------------------------------------------------------------------- access log


def test_the_access_log_has_one_line_per_request_and_no_token(api, caplog):
    caplog.set_level(logging.INFO, logger="tally.scheduler.access")
    job = api.submit(VISION)
    api.call("GET", "/v1/jobs?state=pending&cursor=secret-cursor", ADMIN)
    api.call("GET", f"/v1/jobs/{job}", "wrong-token-xxxxxxxxxxxx")
    api.call("GET", "/v1/jobs/a%0Ab")
    lines = [r.getMessage() for r in caplog.records if r.name == "tally.scheduler.access"]
    assert len(lines) == 4, lines
    assert re.fullmatch(r"POST /v1/jobs 201 \d+\.\dms team:vision", lines[0]), lines[0]
    assert re.fullmatch(r"GET /v1/jobs 400 \d+\.\dms admin", lines[1]), lines[1]
    assert re.fullmatch(rf"GET /v1/jobs/{job} 401 \d+\.\dms -", lines[2]), lines[2]
    assert lines[3].startswith("GET /v1/jobs/a\\x0ab 401"), lines[3]
    text = "\n".join(lines)
    for secret in (VISION, ADMIN, "wrong-token", "secret-cursor", "state=pending"):
        assert secret not in text


@pytest.mark.parametrize(
    ("text", "limit", "shown"),
    [
        pytest.param("/v1/jobs", 256, "/v1/jobs", id="a-plain-path"),
        pytest.param("/v1/jobs/ü-漢", 256, "/v1/jobs/ü-漢", id="printable-unicode"),
        pytest.param("/v1/a b", 256, "/v1/a\\x20b", id="a-space"),
        pytest.param("/v1/a\nb\x7f", 256, "/v1/a\\x0ab\\x7f", id="control-characters"),
        pytest.param("/abcd", 5, "/abcd", id="exactly-the-limit"),
        pytest.param("/abcde", 5, "/abcd…", id="over-the-limit"),
        pytest.param("/a\tbcde", 3, "/a\\x09…", id="escaped-and-cut"),
        pytest.param("", 5, "", id="empty"),
    ],
)
def test_a_logged_path_is_escaped_and_cut_only_where_it_must_be(text, limit, shown):
    assert printable(text, limit) == shown
