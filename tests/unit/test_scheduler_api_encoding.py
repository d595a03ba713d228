"""How the API writes a job: its RFC 3339 times, and a job answer's bytes from pydantic in one
pass (`model_response`) equal to the dumped dict written by orjson (`json_response`)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import orjson
import pytest

from ledger.job_events import JobSpec
from scheduler.api.models import JobAnswer, dumped
from scheduler.api.responses import json_response, model_response
from scheduler.api.views import job_view, rfc3339
from scheduler.records import JobRecord, JobState


@pytest.mark.parametrize(
    ("time_us", "text"),
    [
        (0, "1970-01-01T00:00:00.000000Z"),
        (1, "1970-01-01T00:00:00.000001Z"),
        (-1, "1969-12-31T23:59:59.999999Z"),
        (1_761_955_200_000_000, "2025-11-01T00:00:00.000000Z"),
        (1_709_164_800_123_456, "2024-02-29T00:00:00.123456Z"),
        (253_402_300_799_999_999, "9999-12-31T23:59:59.999999Z"),
    ],
    ids=["epoch", "one-us", "before-epoch", "month-start", "leap-day", "last-us"],
)
def test_rfc3339(time_us: int, text: str) -> None:
    assert rfc3339(time_us) == text


def test_rfc3339_agrees_with_strftime_over_a_sweep() -> None:
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    for time_us in range(-(10**15), 4 * 10**15, 7_777_777_777_777):
        expected = (epoch + timedelta(microseconds=time_us)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        assert rfc3339(time_us) == expected


SPEC = JobSpec(
    job_id="j-ü-1",
    team="vision",
    project="detection",
    user="ana",
    queue="batch",
    gpus=2,
    submit_us=1_761_955_200_000_001,
    estimated_runtime_us=1,
    max_runtime_us=7_200_123_457,
    models=("A100", "H100"),
    priority=-3,
)
RECORDS = {
    "pending": JobRecord(SPEC),
    "running": JobRecord(
        SPEC,
        state=JobState.RUNNING,
        admitted_us=1_761_955_201_000_000,
        started_us=1_761_955_201_500_000,
        pool="a100",
        model="A100",
        gpu_uuids=("GPU-1", "GPU-2"),
        nodes=("n1",),
        hold_gpu_ms=7_200_000,
        hold_micros=3_600_000,
        placement="placed on A100: cheapest acceptable at 1.80/GPU-h",
    ),
    "failed": JobRecord(
        SPEC,
        state=JobState.FAILED,
        reason="exit",
        detail='quoted "text", a tab\t, a line\u2028 and \x01',
        ended_us=1_761_955_300_000_000,
        exit_code=137,
        over_budget=True,
    ),
}


@pytest.mark.parametrize("warning", [None, "not published yet"], ids=["published", "warned"])
@pytest.mark.parametrize("name", list(RECORDS))
def test_model_response_sends_the_bytes_json_response_sends(name: str, warning: str | None) -> None:
    answer = JobAnswer(job=job_view(RECORDS[name]), warning=warning)
    one_pass = model_response(answer, 202, {"X-Test": "1"})
    via_dict = json_response(dumped(answer), 202, {"X-Test": "1"})
    assert one_pass.body == via_dict.body == orjson.dumps(dumped(answer))
    assert (one_pass.status, one_pass.content_type) == (202, "application/json")
    assert one_pass.headers["X-Test"] == "1"
