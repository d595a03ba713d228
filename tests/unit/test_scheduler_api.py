"""The scheduler's HTTP API over a real aiohttp server (the service on the fake executor and an
in-memory publisher): per-team tokens, every 4xx answer, and hostile input that must never get
a 5xx or stop the server."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.executors.fake import RUNS_FOREVER
from tests.unit.test_scheduler_api_support import ADMIN, LANGUAGE, VISION, Api, a_job
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


# ---------------------------------------------------------------------------- tokens


def test_a_team_sees_and_acts_on_its_own_jobs_only(api):
    mine = api.submit(VISION)
    theirs = api.submit(LANGUAGE, project="pretraining")
    api.tick()

    status, body = api.call("GET", "/v1/jobs", VISION)
    assert status == 200 and [j["job_id"] for j in body["jobs"]] == [mine]
    for method, path in (
        ("GET", f"/v1/jobs/{theirs}"),
        ("GET", f"/v1/jobs/{theirs}/explain"),
        ("POST", f"/v1/jobs/{theirs}/cancel"),
        ("DELETE", f"/v1/jobs/{theirs}"),
    ):
        status, body = api.call(method, path, VISION)
        assert (status, body["error"]["code"]) == (404, "not_found"), (method, path)
        # the same answer as for a job that does not exist: nothing leaks
        assert body["error"]["message"] == f"no job {theirs}"
    assert api.rig.dispatcher.records[theirs].state.value == "running"

    status, body = api.call("GET", f"/v1/jobs/{mine}", VISION)
    assert status == 200 and body["job"]["state"] == "running"
    status, body = api.call("POST", f"/v1/jobs/{mine}/cancel", VISION)
    assert status == 200 and body["job"]["state"] == "cancelled"


def test_the_admin_sees_and_cancels_every_teams_jobs(api):
    jobs = {api.submit(VISION), api.submit(LANGUAGE, project="pretraining")}
    status, body = api.call("GET", "/v1/jobs", ADMIN)
    assert status == 200 and {j["job_id"] for j in body["jobs"]} == jobs
    status, body = api.call("GET", "/v1/jobs?team=language", ADMIN)
    assert [j["team"] for j in body["jobs"]] == ["language"]
    for job in jobs:
        status, body = api.call("POST", f"/v1/jobs/{job}/cancel", ADMIN)
        assert status == 200 and body["job"]["state"] == "cancelled"
    status, body = api.call("POST", "/v1/jobs", ADMIN, json=a_job(team="vision"))
    assert status == 201 and body["job"]["team"] == "vision"


def test_explain_queues_and_balances_answer_the_callers_questions(api):
    job = api.submit(VISION, gpus=3)  # more than vision's quota of 2 plus nothing to borrow?
    api.tick()
    status, body = api.call("GET", f"/v1/jobs/{job}/explain", VISION)
    assert status == 200 and body["explanation"].startswith(f"job {job}: team vision")
    status, body = api.call("GET", "/v1/queues", LANGUAGE)
    assert status == 200 and [q["name"] for q in body["queues"]] == ["dev", "train", "serve"]
    dev = body["queues"][0]
    assert (dev["class"], dev["idle_reclaim"], dev["idle_after_min"]) == ("dev", "reclaim", 10)
    status, body = api.call("GET", "/v1/balances", VISION)
    assert status == 200 and [b["team"] for b in body["balances"]] == ["vision"]
    (quota,) = body["balances"][0]["quotas"]
    assert (quota["pool"], quota["nominal"]) == ("a100", 2)
    status, body = api.call("GET", "/v1/balances", ADMIN)
    assert [b["team"] for b in body["balances"]] == ["language", "vision"]
    status, body = api.call("GET", "/v1/health")
    assert status == 200 and body["status"] == "ok"


# ---------------------------------------------------------------------------- every 4xx


def _ended_job(api: Api) -> str:
    job = api.submit(VISION)
    assert api.call("POST", f"/v1/jobs/{job}/cancel", VISION)[0] == 200
    return job


GET = {"method": "GET", "json": None}
RAW = {"json": None}
CASES: list[tuple[str, dict[str, Any], int, str]] = [
    # (id, what differs from a valid submission by vision, status, text in the message)
    ("no-token", {**GET, "token": None}, 401, "bearer token is required"),
    (
        "wrong-scheme",
        {"token": None, "headers": {"Authorization": f"Basic {VISION}"}},
        401,
        "Bearer <token>",
    ),
    (
        "empty-bearer",
        {"token": None, "headers": {"Authorization": "Bearer "}},
        401,
        "Bearer <token>",
    ),
    ("unknown-token", {"token": "not-a-token-at-all-xxxx"}, 401, "not valid"),
    ("submit-for-another-team", {"json": a_job(team="language")}, 404, "no team language"),
    ("list-another-team", {**GET, "path": "/v1/jobs?team=language"}, 404, "no team language"),
    ("balances-another-team", {**GET, "path": "/v1/balances?team=language"}, 404, "no team"),
    ("malformed-json", {**RAW, "data": b'{"gpus": 1,'}, 400, "not valid JSON"),
    ("empty-body", {**RAW, "data": b""}, 400, "empty"),
    ("not-an-object", {"json": [1, 2, 3]}, 400, "JSON object"),
    ("unknown-field", {"json": a_job(colour="blue")}, 400, "unknown fields: colour"),
    ("negative-gpus", {"json": a_job(gpus=-1)}, 400, "gpus"),
    ("zero-gpus", {"json": a_job(gpus=0)}, 400, "gpus"),
    ("huge-gpu-count", {**RAW, "data": b'{"gpus": ' + b"9" * 40 + b"}"}, 400, "gpus"),
    ("gpus-as-bool", {"json": a_job(gpus=True)}, 400, "gpus: expected an integer"),
    ("gpus-as-text", {"json": a_job(gpus="2")}, 400, "gpus: expected an integer"),
    (
        "missing-queue",
        {"json": {k: v for k, v in a_job().items() if k != "queue"}},
        400,
        "queue: required",
    ),
    (
        "no-command",
        {"json": {k: v for k, v in a_job().items() if k != "command"}},
        400,
        "exactly one",
    ),
    ("command-and-script", {"json": a_job(script="#!/bin/sh\n")}, 400, "exactly one"),
    ("empty-argument", {"json": a_job(command=["echo", ""])}, 400, "command"),
    ("script-without-shebang", {"json": a_job(command=None, script="echo hi")}, 400, "#!"),
    (
        "reserved-env",
        {"json": a_job(env={"CUDA_VISIBLE_DEVICES": "0"})},
        400,
        "CUDA_VISIBLE_DEVICES",
    ),
    ("negative-estimate", {"json": a_job(estimated_runtime_s=-5)}, 400, "estimated_runtime_s"),
    (
        "infinite-runtime",
        {**RAW, "data": orjson.dumps(a_job(max_runtime_s=7.5)).replace(b"7.5", b"1e999")},
        400,
        "max_runtime_s",
    ),
    ("not-an-object", {**RAW, "data": b"[1, 2]"}, 400, "must be a JSON object"),
    ("bad-user-name", {"json": a_job(user="../../etc")}, 400, "user"),
    ("bad-state-filter", {**GET, "path": "/v1/jobs?state=zombie"}, 400, "state"),
    ("huge-body", {**RAW, "data": b'{"x": "' + b"a" * 10_000 + b'"}'}, 413, "larger"),
    ("text-content-type", {"headers": {"Content-Type": "text/plain"}}, 415, "JSON"),
    ("unknown-job", {**GET, "path": "/v1/jobs/job-nope"}, 404, "no job job-nope"),
    ("unknown-route", {**GET, "path": "/v1/nothing"}, 404, ""),
    ("wrong-method", {"method": "PUT"}, 405, ""),
    ("cancel-ended-job", {**RAW, "path": "ENDED/cancel"}, 409, "has already ended"),
    ("unknown-queue", {"json": a_job(queue="nope")}, 422, "unknown queue"),
    ("unknown-project", {"json": a_job(project="astrology")}, 422, "no project"),
    ("unknown-model", {"json": a_job(model="V100")}, 422, "no GPUs of model"),
    ("unknown-model-in-a-list", {"json": a_job(model=["A100", "V100"])}, 422, "'V100'"),
    ("empty-model-list", {"json": a_job(model=[])}, 400, "model"),
    ("model-as-number", {"json": a_job(model=7)}, 400, "model"),
    ("admin-unknown-team", {"token": ADMIN, "json": a_job(team="ghosts")}, 422, "unknown team"),
    (
        "admin-lists-unknown-team",
        {**GET, "token": ADMIN, "path": "/v1/jobs?team=x"},
        422,
        "unknown team",
    ),
    ("admin-submits-without-team", {"token": ADMIN}, 400, "team: required"),
]


@pytest.mark.parametrize(
    ("case", "status", "text"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_requests_get_clear_4xx_answers(api, case, status, text):
    spec: dict[str, Any] = {
        "method": "POST",
        "path": "/v1/jobs",
        "token": VISION,
        "json": a_job(),
        "data": None,
        "headers": None,
    }
    spec.update(case)
    if spec["path"].startswith("ENDED"):
        spec["path"] = f"/v1/jobs/{_ended_job(api)}" + spec["path"].removeprefix("ENDED")
    before = len(api.rig.events())
    got, body = api.call(
        spec["method"], spec["path"], spec["token"], spec["json"], spec["data"], spec["headers"]
    )
    assert got == status, body
    assert set(body) == {"error"} and body["error"]["status"] == status
    assert text in body["error"]["message"]
    assert len(api.rig.events()) == before  # a refused request publishes nothing
    assert api.call("GET", "/v1/health")[0] == 200


def test_401_carries_a_bearer_challenge(api):
    async def go() -> str | None:
        async with api.client.get("/v1/jobs") as response:
            return response.headers.get("WWW-Authenticate")

    assert api.loop.run_until_complete(go()) == 'Bearer realm="tally"'


def test_a_submit_the_broker_does_not_take_in_time_is_accepted_not_lost(api):
    api.rig.service.publish_timeout_s = 0.1
    api.rig.service.tick_publish_timeout_s = 0.1
    api.rig.publisher.fail_next = 10**6
    status, body = api.call("POST", "/v1/jobs", VISION, json=a_job())
    assert status == 202 and "not published yet" in body["warning"]
    job = body["job"]["job_id"]
    assert api.rig.events() == []
    api.rig.publisher.fail_next = 0
    api.tick()
    assert [e.job_id for e in api.rig.events()][:1] == [job]
    assert api.call("GET", "/v1/health")[0] == 200


# ---------------------------------------------------------------------------- hostile input

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=5)
    ),
    max_leaves=12,
)
field_values = st.dictionaries(
    st.sampled_from(
        sorted(a_job())
        + [
            "team",
            "env",
            "script",
            "priority",
            "cwd",
            "pool",
            "model",
            "span_nodes",
            "topology",
            "max_runtime_s",
            "x",
        ]
    ),
    json_values,
    max_size=8,
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    body=st.one_of(
        field_values.map(lambda d: json.dumps({**a_job(), **d}).encode()),
        json_values.map(lambda v: json.dumps(v).encode()),
        st.binary(max_size=300),
    ),
    token=st.sampled_from([VISION, ADMIN, "x" * 20, "", "Bearer", "\u00e9\u00e9\u00e9"]),
    path=st.sampled_from(
        [
            "/v1/jobs",
            "/v1/jobs/%2e%2e",
            "/v1/jobs/job-1/cancel",
            "/v1/balances",
            "/v1/jobs/" + "a" * 300,
            "/v1/queues?team=%00",
        ]
    ),
    method=st.sampled_from(["GET", "POST", "DELETE", "PATCH"]),
    content_type=st.sampled_from(["application/json", "text/plain", "", "application/json; x"]),
)
def test_hostile_requests_never_get_a_5xx_or_stop_the_server(
    api, body, token, path, method, content_type
):
    headers = {"Authorization": f"Bearer {token}"}
    if content_type:
        headers["Content-Type"] = content_type
    status, _ = api.call(method, path, None, None, body, headers)
    assert status < 500
    assert api.call("GET", "/v1/health")[0] == 200


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(raw=st.binary(min_size=1, max_size=400))
def test_garbage_on_the_socket_does_not_stop_the_server(api, raw):
    host, port = api.server.host, api.server.port

    def send() -> None:
        with socket.create_connection((host, port), timeout=2) as conn:
            conn.sendall(raw + b"\r\n\r\n")
            conn.settimeout(1)
            with contextlib.suppress(OSError):
                conn.recv(4096)

    api.loop.run_until_complete(asyncio.to_thread(send))
    assert api.call("GET", "/v1/health")[0] == 200
    status, _ = api.call("GET", "/v1/jobs", VISION)
    assert status == 200
