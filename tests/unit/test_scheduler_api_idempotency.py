"""`Idempotency-Key` on submit and cancel, over a real aiohttp server: the same key (per caller)
twice makes one job and repeats its answer, also after the scheduler is rebuilt from the
`jobs` topic; a key reused for a different request is refused. And the events that carry the
key: messages without one are written as before, old messages still decode."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from ledger.job_events import FailReason, JobFailed, JobSpec, JobSubmitted, encode_job_event
from scheduler.executors.fake import RUNS_FOREVER
from scheduler.jobs_topic import Consumed, decode_jobs_value
from tests.unit.test_scheduler_api_support import ADMIN, LANGUAGE, VISION, Api, a_job
from tests.unit.test_scheduler_service_support import T0_US, Rig


def _api(rig: Rig) -> Api:
    rig.executor.default = RUNS_FOREVER
    return Api(rig)


@pytest.fixture
def api(tmp_path) -> Iterator[Api]:
    instance = _api(Rig(tmp_path))
    try:
        yield instance
    finally:
        instance.close()


def keyed(key: str) -> dict[str, str]:
    return {"Idempotency-Key": key}


def submissions(api: Api) -> list[str]:
    return [e.job_id for e in api.rig.events() if isinstance(e, JobSubmitted)]


def restarted(api: Api) -> Api:
    """A new scheduler (same config and work directory) rebuilt from what `api`'s published,
    each message decoded from the bytes it was sent as."""
    fresh = Rig(api.rig.tmp)
    messages = api.rig.publisher.messages
    consumed = [Consumed(0, offset, m.value, m.seq) for offset, m in enumerate(messages)]
    assert fresh.dispatcher.replay(consumed) > 0
    fresh.publisher.messages.extend(messages)  # the topic keeps what was there
    api.close()
    return _api(fresh)


def test_the_same_key_twice_makes_one_job_and_repeats_the_answer(api):
    status, first = api.call("POST", "/v1/jobs", VISION, json=a_job(), headers=keyed("k-1"))
    assert status == 201 and "Idempotent-Replayed" not in api.headers
    status, again = api.call("POST", "/v1/jobs", VISION, json=a_job(), headers=keyed("k-1"))
    assert status == 200 and api.headers["Idempotent-Replayed"] == "true"
    assert again["job"]["job_id"] == first["job"]["job_id"]
    assert submissions(api) == [first["job"]["job_id"]]
    status, other = api.call("POST", "/v1/jobs", VISION, json=a_job(), headers=keyed("k-2"))
    assert status == 201 and other["job"]["job_id"] != first["job"]["job_id"]


def test_a_key_reused_for_a_different_submission_is_refused(api):
    status, first = api.call("POST", "/v1/jobs", VISION, json=a_job(), headers=keyed("k-1"))
    before = len(api.rig.events())
    status, body = api.call("POST", "/v1/jobs", VISION, json=a_job(gpus=2), headers=keyed("k-1"))
    assert (status, body["error"]["code"]) == (422, "idempotency_key_reused")
    assert f"different submission (job {first['job']['job_id']})" in body["error"]["message"]
    assert len(api.rig.events()) == before


def test_keys_are_scoped_by_caller(api):
    key = keyed("shared-key")
    _, vision = api.call("POST", "/v1/jobs", VISION, json=a_job(), headers=key)
    _, admin = api.call("POST", "/v1/jobs", ADMIN, json=a_job(team="vision"), headers=key)
    _, language = api.call(
        "POST", "/v1/jobs", LANGUAGE, json=a_job(project="pretraining"), headers=key
    )
    ids = [b["job"]["job_id"] for b in (vision, admin, language)]
    assert len(set(ids)) == 3 and submissions(api) == ids


@pytest.mark.parametrize(
    "key", ["", "x" * 129, "has space", "naïve", "tab\there"], ids=["empty", "long", "space",
                                                                    "non-ascii", "control"]
)  # fmt: skip
def test_a_malformed_key_is_a_400(api, key):
    headers = {"Idempotency-Key": key.encode("utf-8").decode("latin-1")}
    status, body = api.call("POST", "/v1/jobs", VISION, json=a_job(), headers=headers)
    assert status == 400 and "Idempotency-Key" in body["error"]["message"]
    assert submissions(api) == []


def test_a_repeat_while_the_broker_is_down_stays_one_job(api):
    api.rig.service.publish_timeout_s = 0.05
    api.rig.publisher.fail_next = 10**6
    answers = [
        api.call("POST", "/v1/jobs", VISION, json=a_job(), headers=keyed("k-down"))
        for _ in range(2)
    ]
    assert [status for status, _ in answers] == [202, 202]
    (job,) = {body["job"]["job_id"] for _, body in answers}
    api.rig.publisher.fail_next = 0
    status, body = api.call("POST", "/v1/jobs", VISION, json=a_job(), headers=keyed("k-down"))
    assert (status, body["job"]["job_id"], body["warning"]) == (200, job, None)
    assert submissions(api) == [job]


def test_a_key_survives_a_restart_rebuilt_from_the_topic(api):
    _, first = api.call("POST", "/v1/jobs", VISION, json=a_job(), headers=keyed("k-1"))
    job = first["job"]["job_id"]
    api.tick()
    api = restarted(api)
    try:
        status, again = api.call("POST", "/v1/jobs", VISION, json=a_job(), headers=keyed("k-1"))
        assert (status, again["job"]["job_id"]) == (200, job)
        status, body = api.call(
            "POST", "/v1/jobs", VISION, json=a_job(gpus=3), headers=keyed("k-1")
        )
        assert (status, body["error"]["code"]) == (422, "idempotency_key_reused")
        assert submissions(api) == [job]
        # the key is the caller's: the admin's same key is a new job
        status, _ = api.call(
            "POST", "/v1/jobs", ADMIN, json=a_job(team="vision"), headers=keyed("k-1")
        )
        assert status == 201
    finally:
        api.close()


def test_cancel_with_a_key_answers_the_same_twice_and_after_a_restart(api):
    job, other = api.submit(VISION), api.submit(VISION)
    status, body = api.call("POST", f"/v1/jobs/{job}/cancel", VISION, headers=keyed("c-1"))
    assert (status, body["job"]["state"]) == (200, "cancelled")
    events = len(api.rig.events())
    status, body = api.call("DELETE", f"/v1/jobs/{job}", VISION, headers=keyed("c-1"))
    assert (status, body["job"]["state"], api.headers.get("Idempotent-Replayed")) == (
        200,
        "cancelled",
        "true",
    )
    assert len(api.rig.events()) == events
    # a new request for an ended job is still a conflict; a key reused for another job, refused
    status, body = api.call("POST", f"/v1/jobs/{job}/cancel", VISION, headers=keyed("c-2"))
    assert status == 409 and "has already ended" in body["error"]["message"]
    status, body = api.call("POST", f"/v1/jobs/{other}/cancel", VISION, headers=keyed("c-1"))
    assert (status, body["error"]["code"]) == (422, "idempotency_key_reused")
    assert api.rig.dispatcher.records[other].state.value == "pending"
    api = restarted(api)
    try:
        status, body = api.call("POST", f"/v1/jobs/{job}/cancel", VISION, headers=keyed("c-1"))
        assert (status, body["job"]["state"]) == (200, "cancelled")
        status, body = api.call("POST", f"/v1/jobs/{other}/cancel", VISION, headers=keyed("c-1"))
        assert status == 422
    finally:
        api.close()


# ---------------------------------------------------------------------------- the events

SPEC = JobSpec("job-1", "vision", "detection", "ada", "dev", 1, T0_US, 3_600_000_000)


def _data(event: Any) -> dict[str, Any]:
    return dict(orjson.loads(encode_job_event(event, "tally://scheduler"))["data"])


@pytest.mark.parametrize(
    ("event", "fields"),
    [
        (JobSubmitted(SPEC, T0_US), {"spec", "time_us"}),
        (
            JobFailed("job-1", FailReason.CANCELLED, 1, False, T0_US),
            {"job_id", "reason", "attempt", "retry", "time_us", "exit_code", "detail"},
        ),
    ],
    ids=["submitted", "failed"],
)
def test_events_without_a_key_are_written_as_before(event, fields):
    assert set(_data(event)) == fields
    assert decode_jobs_value(encode_job_event(event, "tally://scheduler")) == event


@pytest.mark.parametrize(
    "event",
    [
        JobSubmitted(SPEC, T0_US, "k-1", "team:vision", "ab" * 16),
        JobFailed("job-1", FailReason.CANCELLED, 1, False, T0_US, None, "", "k", "admin"),
    ],
    ids=["submitted", "failed"],
)
def test_events_with_a_key_round_trip(event):
    assert _data(event)["idempotency_key"] == event.idempotency_key
    assert decode_jobs_value(encode_job_event(event, "tally://scheduler")) == event


def test_a_message_written_before_keys_existed_still_decodes():
    old = (
        b'{"specversion":"1.0","id":"ignored","type":"tally.job.submitted",'
        b'"source":"tally://scheduler","subject":"job-1","time":1793491200000000,"schema":1,'
        b'"data":{"spec":{"job_id":"job-1","team":"vision","project":"detection","user":"ada",'
        b'"queue":"dev","gpus":1,"submit_us":1793491200000000,'
        b'"estimated_runtime_us":3600000000,"max_runtime_us":null,"model":null,"pool":null,'
        b'"span_nodes":true,"priority":null},"time_us":1793491200000000}}'
    )
    current = encode_job_event(JobSubmitted(SPEC, T0_US), "tally://scheduler")
    old = old.replace(b'"ignored"', b'"' + orjson.loads(current)["id"].encode() + b'"')
    assert old == current  # byte for byte what this build writes for an unkeyed submission
    decoded = decode_jobs_value(old)
    assert decoded == JobSubmitted(SPEC, T0_US) and decoded.idempotency_key is None
