from dataclasses import fields
from typing import Any

import orjson
import pytest

from ledger.errors import EventError, UnknownSchemaError
from ledger.job_events import (
    EVENT_CLASSES,
    FailReason,
    GpuAssigned,
    GpuReleased,
    JobAdmitted,
    JobEvent,
    JobFailed,
    JobFinished,
    JobPreempted,
    JobReclaimed,
    JobSpec,
    JobStarted,
    JobSubmitted,
    JobWaiting,
    PreemptReason,
    WaitReason,
    decode_job_event,
    encode_job_event,
    job_envelope,
    job_envelope_to_dict,
    job_event_id,
    model_fields,
)
from ledger.topology import TopologyNeed
from tests.scheduler_builders import T0_US, a_spec

SOURCE = "scheduler://test"

ADMITTED = JobAdmitted(
    job_id="job-1",
    team="vision",
    queue="train",
    pool="main",
    model="A100",
    gpu_uuids=("GPU-a", "GPU-b"),
    nodes=("node-1", "node-2"),
    priority=-5,
    borrowed_gpus=1,
    preemptible=True,
    hold_micros=4_000_000,
    hold_gpu_ms=7_200_000,
    attempt=2,
    time_us=T0_US,
)
ASSIGNED = GpuAssigned(
    gpu_uuid="GPU-a",
    node="node-1",
    pool="main",
    model="A100",
    job_id="job-1",
    team="vision",
    project="detection",
    user="ada",
    time_us=T0_US,
)

EVERY_EVENT: list[Any] = [
    pytest.param(JobSubmitted(spec=a_spec(), time_us=T0_US), id="submitted"),
    pytest.param(
        JobSubmitted(
            spec=a_spec(model="H100", pool="main", span_nodes=False, priority=-3, max_runtime_us=9),
            time_us=T0_US,
        ),
        id="submitted-with-constraints",
    ),
    pytest.param(ADMITTED, id="admitted"),
    pytest.param(
        JobSubmitted(spec=a_spec(model=None, models=("A100", "H100")), time_us=T0_US),
        id="submitted-accepting-several-models",
    ),
    pytest.param(
        JobAdmitted(
            **{
                **{f.name: getattr(ADMITTED, f.name) for f in fields(ADMITTED)},
                "placement": "placed on A100: cheapest acceptable at 1.80/GPU-h",
            }
        ),
        id="admitted-with-placement",
    ),
    pytest.param(JobWaiting("job-1", WaitReason.BUDGET_EXHAUSTED, T0_US, "money: …"), id="waiting"),
    pytest.param(JobStarted("job-1", T0_US), id="started"),
    pytest.param(JobStarted("job-1", T0_US, slurm_job_id="4242"), id="started-under-slurm"),
    pytest.param(
        JobPreempted("job-1", "job-2", PreemptReason.RECLAIM_LENT_QUOTA, T0_US, "lent"),
        id="preempted",
    ),
    pytest.param(JobReclaimed("job-1", ("GPU-a",), T0_US - 1, T0_US, "idle"), id="reclaimed"),
    pytest.param(JobFinished("job-1", T0_US), id="finished"),
    pytest.param(
        JobFailed("job-1", FailReason.EXIT_NONZERO, 1, True, T0_US, exit_code=-9), id="failed"
    ),
    pytest.param(ASSIGNED, id="gpu-assigned"),
    pytest.param(
        GpuReleased(**{f.name: getattr(ASSIGNED, f.name) for f in fields(GpuReleased)}),
        id="gpu-released",
    ),
]


@pytest.mark.parametrize("event", EVERY_EVENT)
def test_every_event_round_trips(event: JobEvent) -> None:
    envelope = decode_job_event(encode_job_event(event, SOURCE))
    assert envelope.data == event
    assert envelope.type is event.KIND
    assert envelope == job_envelope(event, SOURCE)


@pytest.mark.parametrize("event", EVERY_EVENT)
def test_an_event_is_written_byte_for_byte_as_its_envelope_object(event: JobEvent) -> None:
    """`encode_job_event` writes the object of the event's envelope without building one."""
    wrapped = orjson.dumps(job_envelope_to_dict(job_envelope(event, SOURCE)))
    assert encode_job_event(event, SOURCE) == wrapped


def test_every_event_type_has_a_round_trip_case() -> None:
    covered = {p.values[0].KIND for p in EVERY_EVENT}
    assert covered == set(EVENT_CLASSES)


def test_decoded_sequences_are_tuples() -> None:
    decoded = decode_job_event(encode_job_event(ADMITTED, SOURCE)).data
    assert isinstance(decoded, JobAdmitted)
    assert decoded.gpu_uuids == ("GPU-a", "GPU-b")
    assert isinstance(decoded.gpu_uuids, tuple)


def test_job_events_are_keyed_by_job_and_gpu_events_by_gpu() -> None:
    assert job_envelope(ADMITTED, SOURCE).subject == "job-1"
    assert job_envelope(ASSIGNED, SOURCE).subject == "GPU-a"


def test_id_is_derived_from_content() -> None:
    again = JobAdmitted(**{f.name: getattr(ADMITTED, f.name) for f in fields(ADMITTED)})
    assert job_event_id(again, SOURCE) == job_event_id(ADMITTED, SOURCE)
    assert job_event_id(ADMITTED, "scheduler://other") != job_event_id(ADMITTED, SOURCE)


@pytest.mark.parametrize(
    ("one", "other"),
    [
        pytest.param(
            JobWaiting("job-1", WaitReason.NO_CAPACITY, T0_US),
            JobWaiting("job-1", WaitReason.BUDGET_EXHAUSTED, T0_US),
            id="waiting-reasons-at-one-time",
        ),
        pytest.param(
            JobFinished("job-1", T0_US), JobStarted("job-1", T0_US), id="types-at-one-time"
        ),
        pytest.param(
            ASSIGNED,
            GpuReleased(**{f.name: getattr(ASSIGNED, f.name) for f in fields(GpuReleased)}),
            id="assign-and-release-one-gpu",
        ),
        pytest.param(JobFinished("job-1", T0_US), JobFinished("job-1", T0_US + 1), id="times"),
    ],
)
def test_distinct_events_get_distinct_ids(one: JobEvent, other: JobEvent) -> None:
    assert job_event_id(one, SOURCE) != job_event_id(other, SOURCE)


def _wire(event: JobEvent = ADMITTED) -> dict[str, Any]:
    parsed: dict[str, Any] = orjson.loads(encode_job_event(event, SOURCE))
    return parsed


def _with_data(**changes: Any) -> dict[str, Any]:
    wire = _wire()
    wire["data"].update(changes)
    return wire


def _without(key: str) -> dict[str, Any]:
    wire = _wire()
    del wire["data"][key]
    return wire


def _submitted_with(**changes: Any) -> dict[str, Any]:
    wire = _wire(JobSubmitted(spec=a_spec(), time_us=T0_US))
    wire["data"]["spec"].update(changes)
    return wire


BAD: list[Any] = [
    pytest.param(_with_data(attempt=1.0), "expected an integer", id="float-for-int"),
    pytest.param(_with_data(attempt=True), "expected an integer", id="bool-for-int"),
    pytest.param(_with_data(attempt="1"), "expected an integer", id="string-for-int"),
    pytest.param(_with_data(hold_micros=-1), "out of range", id="negative-amount"),
    pytest.param(_with_data(time_us=-1), "out of range", id="negative-time"),
    pytest.param(_with_data(preemptible=1), "true or false", id="int-for-bool"),
    pytest.param(_with_data(gpu_uuids="GPU-a"), "expected an array", id="string-for-array"),
    pytest.param(_with_data(gpu_uuids=["GPU-a", 3]), "non-empty string", id="int-in-array"),
    pytest.param(_with_data(team=""), "non-empty string", id="empty-team"),
    pytest.param(_with_data(team="x" * 300), "longer than", id="long-team"),
    pytest.param(_with_data(surprise=1), "unknown fields", id="unknown-field"),
    pytest.param(_without("team"), "missing", id="missing-field"),
    pytest.param(_submitted_with(gpus=0), "out of range", id="zero-gpus"),
    pytest.param(_submitted_with(span_nodes="yes"), "true or false", id="string-for-bool"),
    pytest.param(
        {**_wire(), "data": {**_wire()["data"], "job_id": None}},
        "non-empty string",
        id="null-required",
    ),
    pytest.param({**_wire(), "id": "0" * 32}, "does not match", id="forged-id"),
    pytest.param({**_wire(), "subject": "job-2"}, "subject", id="wrong-subject"),
    pytest.param({**_wire(), "time": 1}, "time", id="wrong-time"),
    pytest.param({**_wire(), "schema": "1"}, "integer version", id="string-schema"),
    pytest.param({**_wire(), "data": []}, "expected an object", id="data-not-object"),
    pytest.param([_wire()], "expected a JSON object", id="array-not-object"),
]


@pytest.mark.parametrize(("wire", "message"), BAD)
def test_invalid_events_are_refused(wire: Any, message: str) -> None:
    with pytest.raises(EventError, match=message):
        decode_job_event(orjson.dumps(wire))


def test_unknown_enum_value_is_refused() -> None:
    wire = _wire(JobWaiting("job-1", WaitReason.NO_CAPACITY, T0_US))
    wire["data"]["reason"] = "tired"
    with pytest.raises(EventError, match="unknown value 'tired'"):
        decode_job_event(orjson.dumps(wire))


@pytest.mark.parametrize(
    ("wire", "error"),
    [
        pytest.param({**_wire(), "type": "tally.job.exploded"}, UnknownSchemaError, id="type"),
        pytest.param({**_wire(), "schema": 2}, UnknownSchemaError, id="newer-schema"),
    ],
)
def test_unknown_types_and_schemas_are_refused(wire: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        decode_job_event(orjson.dumps(wire))


@pytest.mark.parametrize(
    "raw", [pytest.param(b"", id="empty"), pytest.param(b"{not json", id="not-json")]
)
def test_undecodable_bytes_raise_event_error(raw: bytes) -> None:
    with pytest.raises(EventError):
        decode_job_event(raw)


def test_negative_priority_and_exit_code_are_allowed() -> None:
    spec = JobSpec(**{**_spec_fields(), "priority": -10})
    decoded = decode_job_event(encode_job_event(JobSubmitted(spec, T0_US), SOURCE)).data
    assert isinstance(decoded, JobSubmitted)
    assert decoded.spec.priority == -10


def _spec_fields() -> dict[str, Any]:
    spec = a_spec()
    return {f.name: getattr(spec, f.name) for f in fields(spec)}


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"gpus": 0}, id="no-gpus"),
        pytest.param({"team": ""}, id="no-team"),
        pytest.param({"estimated_runtime_us": -1}, id="negative-estimate"),
        pytest.param({"max_runtime_us": 0}, id="zero-maximum-runtime"),
        pytest.param({"models": ("A100",)}, id="models-with-one-model"),
        pytest.param({"models": ("H100", "A100")}, id="models-unsorted"),
        pytest.param({"models": ("A100", "A100")}, id="models-repeated"),
        pytest.param({"model": "A100", "models": ("A100", "H100")}, id="model-and-models"),
    ],
)
def test_an_invalid_job_spec_cannot_be_built(changes: dict[str, Any]) -> None:
    with pytest.raises(EventError):
        JobSpec(**{**_spec_fields(), **changes})


@pytest.mark.parametrize(
    "event",
    [
        pytest.param(JobSubmitted(spec=a_spec(model="A100"), time_us=T0_US), id="one-model-spec"),
        pytest.param(ADMITTED, id="admission-without-placement"),
        pytest.param(JobStarted("job-1", T0_US), id="started-without-slurm-id"),
    ],
)
def test_events_without_the_new_fields_are_written_as_before(event: JobEvent) -> None:
    """A spec without `models` and an admission without `placement` are the same bytes as
    before those fields existed, so old and new events decode alike."""
    data = orjson.loads(encode_job_event(event, SOURCE))["data"]
    new = {"placement", "idempotency_key", "requested_by", "request_digest", "client"}
    new |= {"slurm_job_id"}
    assert set(data) == {f.name for f in fields(event)} - new  # type: ignore[arg-type]
    if "spec" in data:
        added = {"models", "topology", "mig_profile", "gpu_share"}
        assert set(data["spec"]) == {f.name for f in fields(JobSpec)} - added
    assert decode_job_event(encode_job_event(event, SOURCE)).data == event


@pytest.mark.parametrize("need", list(TopologyNeed), ids=lambda n: n.value)
def test_a_required_topology_is_written_and_read_back(need: TopologyNeed) -> None:
    event = JobSubmitted(spec=a_spec(topology=need), time_us=T0_US)
    value = encode_job_event(event, SOURCE)
    assert orjson.loads(value)["data"]["spec"]["topology"] == need.value
    assert decode_job_event(value).data == event
    bad = value.replace(f'"topology":"{need.value}"'.encode(), b'"topology":"rack"')
    with pytest.raises(EventError, match="topology"):
        decode_job_event(bad)


def test_accepted_models() -> None:
    assert a_spec(model=None).accepted_models == ()
    assert a_spec(model="A100").accepted_models == ("A100",)
    several = a_spec(**model_fields(("H100", "A100", "H100")))
    assert several.model is None and several.accepted_models == ("A100", "H100")
    assert model_fields(("A100",)) == {"model": "A100", "models": None}
    assert model_fields(()) == {"model": None, "models": None}
