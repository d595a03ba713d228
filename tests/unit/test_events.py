import json
from dataclasses import replace

import orjson
import pytest

from ledger.errors import UnknownSchemaError
from ledger.events import (
    DeadLetter,
    EventType,
    SchemaRegistry,
    decode_message,
    encode_batch,
    encode_envelope,
    envelope_for,
    envelope_from_dict,
    envelope_to_dict,
    event_id,
)
from tests.builders import a_mig, a_process, a_sample, an_envelope, an_owner


def test_id_is_derived_from_source_subject_and_time():
    a = an_envelope()
    b = an_envelope()
    assert a.id == b.id
    assert a.id == event_id("sim://node-01", a.data.gpu_uuid, a.data.sample_time_us)
    later = an_envelope(sample_time_us=a.data.sample_time_us + 1)
    assert later.id != a.id
    other_source = envelope_for(a.data, "nvml://node-01")
    assert other_source.id != a.id


def test_mig_slices_are_distinct_subjects():
    one = an_envelope(mig=a_mig(gi=1))
    two = an_envelope(mig=a_mig(gi=2))
    assert one.subject != two.subject
    assert one.id != two.id


@pytest.mark.parametrize(
    "sample",
    [
        pytest.param(a_sample(), id="whole-gpu"),
        pytest.param(a_sample(mig=a_mig(), processes=()), id="mig-no-processes"),
        pytest.param(
            a_sample(
                processes=(a_process(owner=an_owner()), a_process(pid=7, owner=None, sm=None))
            ),
            id="mixed-owners",
        ),
        pytest.param(
            a_sample(
                power_mw=None,
                energy_mj=None,
                util_mem_pct=None,
                temperature_c=61,
                sm_clock_mhz=1980,
                xid_errors=0,
            ),
            id="optional-fields",
        ),
        pytest.param(a_sample(owner=an_owner(team="search", project=None)), id="gpu-owner"),
    ],
)
def test_codec_round_trips(sample):
    envelope = envelope_for(sample, "sim://node-01")
    envelopes, dead = decode_message(encode_batch([envelope, envelope]))
    assert dead == []
    assert envelopes == [envelope, envelope]
    single, dead = decode_message(encode_envelope(envelope))
    assert (single, dead) == ([envelope], [])


def _with(data_changes=None, **envelope_changes):
    obj = envelope_to_dict(an_envelope())
    obj.update(envelope_changes)
    if data_changes:
        obj["data"] = {**obj["data"], **data_changes}
    return orjson.dumps(obj)


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        pytest.param(b"", "empty message", id="empty"),
        pytest.param(b"{not json", "not JSON", id="not-json"),
        pytest.param(b"[]", "empty batch", id="empty-batch"),
        pytest.param(b"42", "expected a JSON object", id="scalar"),
        pytest.param(_with(type="com.example.other"), "unknown event type", id="unknown-type"),
        pytest.param(_with(schema=99), "newer than this build", id="future-schema"),
        pytest.param(_with(schema="1"), "schema: expected an integer", id="schema-string"),
        pytest.param(
            _with({"util_gpu_pct": 55.5}),
            "util_gpu_pct: expected an integer",
            id="float-utilisation",
        ),
        pytest.param(_with({"util_gpu_pct": 101}), "out of range", id="utilisation-over-100"),
        pytest.param(_with({"memory_used_bytes": True}), "expected an integer", id="bool-as-int"),
        pytest.param(_with({"interval_us": 0}), "interval_us", id="zero-interval"),
        pytest.param(_with({"gpu_uuid": ""}), "gpu_uuid", id="empty-uuid"),
        pytest.param(
            _with({"source": "carrier-pigeon"}), "unknown sample source", id="unknown-source"
        ),
        pytest.param(_with({"processes": "lots"}), "processes", id="processes-not-array"),
        pytest.param(_with(id="0" * 32), "id: does not match", id="forged-id"),
        pytest.param(
            json.dumps({**envelope_to_dict(an_envelope()), "schema": 2**70}).encode(),
            "schema: expected an integer",
            id="huge-int-becomes-float",
        ),
    ],
)
def test_bad_input_becomes_a_dead_letter(value, reason):
    envelopes, dead = decode_message(value)
    assert envelopes == []
    assert len(dead) == 1
    assert isinstance(dead[0], DeadLetter)
    assert reason in dead[0].reason


def test_one_bad_event_in_a_batch_spares_the_others():
    good = envelope_to_dict(an_envelope())
    bad = {**good, "data": {**good["data"], "util_gpu_pct": -1}}
    envelopes, dead = decode_message(orjson.dumps([good, bad, good]))
    assert len(envelopes) == 2
    assert len(dead) == 1
    assert dead[0].event_id == good["id"]


def test_upcaster_turns_an_old_event_into_the_current_shape():
    """A v0 sample stored utilisation as a 0..1 ratio under another name; v1 reads percent."""

    def v0_to_v1(data):
        data = dict(data)
        data["util_gpu_pct"] = round(data.pop("utilisation") * 100)
        return data

    registry = SchemaRegistry(current={EventType.GPU_SAMPLE: 1})
    registry.register(EventType.GPU_SAMPLE, 0, v0_to_v1)
    current = envelope_to_dict(an_envelope(util_gpu_pct=73))
    old = {**current, "schema": 0, "data": dict(current["data"])}
    old["data"]["utilisation"] = 0.73
    del old["data"]["util_gpu_pct"]
    envelope = envelope_from_dict(old, registry)
    assert envelope.data.util_gpu_pct == 73
    assert envelope.schema == 1
    assert envelope == envelope_from_dict(current, registry)


def test_missing_upcaster_is_an_unknown_schema():
    registry = SchemaRegistry(current={EventType.GPU_SAMPLE: 2})
    with pytest.raises(UnknownSchemaError, match="no upcaster"):
        registry.upcast(EventType.GPU_SAMPLE, 1, {})


def test_owner_with_no_fields_is_no_owner():
    obj = envelope_to_dict(an_envelope(processes=(a_process(owner=None),)))
    obj["data"]["processes"][0]["owner"] = {"team": "", "project": None}
    envelopes, dead = decode_message(orjson.dumps(obj))
    assert dead == []
    assert envelopes[0].data.processes[0].owner is None


def test_decoded_values_are_frozen_tuples():
    envelopes, _ = decode_message(encode_batch([an_envelope()]))
    sample = envelopes[0].data
    assert isinstance(sample.processes, tuple)
    with pytest.raises(AttributeError):
        sample.util_gpu_pct = 1  # type: ignore[misc]
    assert replace(sample, util_gpu_pct=1).util_gpu_pct == 1
