"""Garbage at the scheduler API's boundary, over a real aiohttp server: random, wrong-typed,
deeply nested, oversized and slow requests against every route of the route table. Each is
refused with a 4xx that says why (never a 5xx), the server stays up, and a valid submission
sent afterwards makes exactly one job."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger.job_events import JobSubmitted
from scheduler.api.models import JobsQuery, SubmitBody
from scheduler.api.routes import ROUTES
from scheduler.executors.fake import RUNS_FOREVER
from tests.unit.test_scheduler_api_support import ADMIN, MAX_BODY, VISION, Api, a_job
from tests.unit.test_scheduler_service_support import Rig

BODY_TIMEOUT_S = 0.5


@pytest.fixture
def api(tmp_path) -> Iterator[Api]:
    rig = Rig(tmp_path)
    rig.executor.default = RUNS_FOREVER
    instance = Api(rig, body_timeout_s=BODY_TIMEOUT_S)
    try:
        yield instance
    finally:
        instance.close()


def assert_refused_with_a_reason(status: int, body: Any) -> None:
    assert status < 500, body
    if status >= 400:
        assert isinstance(body, dict) and set(body) == {"error"}, body
        assert body["error"]["status"] == status and body["error"]["message"].strip()


def assert_alive_and_exact(api: Api) -> None:
    """The server answers, and one valid submission makes exactly one job."""
    before = [e for e in api.rig.events() if isinstance(e, JobSubmitted)]
    status, body = api.call("POST", "/v1/jobs", VISION, json=a_job())
    assert status == 201, body
    after = [e for e in api.rig.events() if isinstance(e, JobSubmitted)]
    assert [e.job_id for e in after[len(before) :]] == [body["job"]["job_id"]]


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=10,
)
submit_fields = sorted(SubmitBody.model_fields)
mutated_submissions = st.dictionaries(
    st.sampled_from([*submit_fields, "x", ""]), json_values, min_size=1, max_size=4
).map(lambda changes: {**a_job(), **changes})
nested = st.integers(min_value=1, max_value=1500).map(lambda n: "[" * n + "]" * n)
bodies = st.one_of(
    mutated_submissions.map(lambda d: json.dumps(d).encode()),
    json_values.map(lambda v: json.dumps(v).encode()),
    nested.map(str.encode),
    st.binary(max_size=200),
    st.just(b""),
    st.just(b'{"gpus": 1, "x": "' + b"a" * (MAX_BODY * 2) + b'"}'),
)
query_names = sorted({*JobsQuery.model_fields, "x", "cursor"})
queries = st.one_of(
    st.dictionaries(st.sampled_from(query_names), st.text(max_size=20), max_size=3).map(urlencode),
    st.sampled_from(["%zz", "&&=&", "limit=1&limit=2", "since=%00", "cursor=" + "A" * 600]),
)
paths = st.sampled_from(sorted({r.path for r in ROUTES}))
job_ids = st.sampled_from(["JOB", "job-nope", "%2e%2e", "a" * 300, "%00", "job%0A"])


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    path=paths,
    job_id=job_ids,
    query=queries,
    method=st.sampled_from(["GET", "POST", "DELETE", "PUT"]),
    body=bodies,
    token=st.sampled_from([VISION, ADMIN, "", "x" * 20]),
    content_type=st.sampled_from(["application/json", "text/plain", "", "application/json; q"]),
    key=st.sampled_from([None, "k-1", "", "\u00e9"]),
)
def test_garbage_on_every_route_is_a_4xx_with_a_reason(
    api, path, job_id, query, method, body, token, content_type, key
):
    job = api.rig.dispatcher.jobs(None)[0].job_id if api.rig.dispatcher.records else "job-x"
    target = path.replace("{job_id}", job if job_id == "JOB" else job_id)
    headers = {"Authorization": f"Bearer {token}"}
    if content_type:
        headers["Content-Type"] = content_type
    if key is not None:
        headers["Idempotency-Key"] = key.encode().decode("latin-1")
    status, answer = api.call(method, f"{target}?{query}", None, None, body, headers)
    assert_refused_with_a_reason(status, answer)
    assert_alive_and_exact(api)


@pytest.mark.parametrize(
    ("body", "status", "text"),
    [
        (b"[" * 5000 + b"]" * 5000, 413, "larger"),
        (b"[" * 2000 + b"]" * 2000, 400, "not valid JSON"),
        (json.dumps({**a_job(), "env": {"A": {"B": {"C": [[[]]]}}}}).encode(), 400, "env.A"),
        (json.dumps(a_job(gpus=10**30)).encode(), 400, "gpus"),
        (json.dumps(a_job(command=[])).encode(), 400, "command"),
        (json.dumps(a_job(max_runtime_s=1e300)).encode(), 400, "max_runtime_s"),
    ],
    ids=["deep-and-huge", "deep", "nested-env", "huge-int", "empty-command", "huge-float"],
)
def test_deep_huge_and_wrong_typed_bodies(api, body, status, text):
    got, answer = api.call("POST", "/v1/jobs", VISION, data=body)
    assert got == status and text in answer["error"]["message"], answer
    assert_alive_and_exact(api)


def test_an_oversized_chunked_body_is_a_413(api):
    async def go() -> tuple[int, Any]:
        async def chunks():  # no Content-Length: the server learns the size as it reads
            for _ in range(10):
                yield b"x" * 1024

        async with api.client.post(
            "/v1/jobs",
            data=chunks(),
            headers={"Authorization": f"Bearer {VISION}", "Content-Type": "application/json"},
        ) as response:
            return response.status, await response.json()

    status, body = api.loop.run_until_complete(go())
    assert status == 413 and "larger than 4096 bytes" in body["error"]["message"]
    assert_alive_and_exact(api)


def test_a_slow_body_is_cut_off_without_blocking_other_requests(api):
    async def go() -> tuple[bytes, float, float]:
        reader, writer = await asyncio.open_connection(api.server.host, api.server.port)
        head = (
            f"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {VISION}\r\n"
            "Content-Type: application/json\r\nContent-Length: 200\r\n\r\n"
        )
        started = time.monotonic()
        writer.write(head.encode() + b'{"gpus": 1,')
        await writer.drain()
        others = []
        for _ in range(3):  # the trickle goes on; other callers are answered at once
            writer.write(b" ")
            await writer.drain()
            t0 = time.monotonic()
            async with api.client.get(
                "/v1/jobs", headers={"Authorization": f"Bearer {VISION}"}
            ) as r:
                assert r.status == 200
            others.append(time.monotonic() - t0)
            await asyncio.sleep(0.05)
        answer = await asyncio.wait_for(reader.readuntil(b"}}"), 5)  # the whole error body
        took = time.monotonic() - started
        writer.close()
        return answer, took, max(others)

    answer, took, slowest_other = api.loop.run_until_complete(go())
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert (
        b"Connection: close" in answer
        and b'"code":"request_timeout"' in answer
        and b"not sent within 0.5 s" in answer
    )
    assert BODY_TIMEOUT_S <= took < BODY_TIMEOUT_S + 2
    assert slowest_other < BODY_TIMEOUT_S / 2
    assert_alive_and_exact(api)
