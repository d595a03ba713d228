"""The sample decoder's fast path (`_common_sample`) accepts exactly what the checked decoder
accepts and builds the same value; anything it does not take falls through to the checked
decoder, whose error then names the field."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.errors import EventError
from ledger.events import EventType, sample_to_dict
from ledger.sample_decode import _checked_sample, _common_sample, sample_data_from_dict
from tests.builders import a_mig, a_process, a_sample, an_owner

FIELDS = (
    "node", "gpu_uuid", "gpu_index", "model", "pool", "util_gpu_pct", "util_mem_pct",
    "memory_used_bytes", "memory_total_bytes", "power_mw", "energy_mj", "mig", "processes",
    "owner", "source", "sample_time_us", "interval_us", "temperature_c", "sm_clock_mhz",
    "xid_errors", "energy_delta_mj",
)  # fmt: skip

HOSTILE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, 100, 101, 200, 201, 1023, 1024, 10_000, 10**12, 10**12 + 1, -1]),
    st.floats(allow_nan=True),
    st.text(max_size=3),
    st.sampled_from(["", "x" * 256, "x" * 257, "sim", "nvml", "dcgm", "bogus"]),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.sampled_from(["team", "pid", "used_memory_bytes"]), st.integers()),
)

PROCESS_HOSTILE = st.fixed_dictionaries(
    {},
    optional={
        "pid": HOSTILE,
        "used_memory_bytes": HOSTILE,
        "sm_util_pct": HOSTILE,
        "owner": st.one_of(
            HOSTILE,
            st.fixed_dictionaries(
                {},
                optional={
                    k: st.one_of(st.none(), st.text(max_size=2), st.integers())
                    for k in ("team", "project", "user", "job")
                },
            ),
        ),
    },
)


def _decoded(data: Any) -> object:
    """What the checked decoder makes of `data`: the sample, or its error message."""
    try:
        return _checked_sample(data)
    except EventError as exc:
        return f"EventError: {exc}"


def _valid() -> dict[str, Any]:
    owner = an_owner()
    return sample_to_dict(
        a_sample(processes=(a_process(owner=owner), a_process(pid=7, owner=None)), owner=owner)
    )


@settings(max_examples=400, deadline=None)
@given(
    changes=st.dictionaries(st.sampled_from(FIELDS), HOSTILE, max_size=3),
    dropped=st.sets(st.sampled_from(FIELDS), max_size=2),
    processes=st.none() | st.lists(PROCESS_HOSTILE, max_size=3),
)
def test_the_fast_path_agrees_with_the_checked_decoder(changes, dropped, processes):
    data = _valid() | changes
    for key in dropped:
        data.pop(key, None)
    if processes is not None:
        data["processes"] = processes
    expected = _decoded(data)
    fast = _common_sample(data)
    if fast is not None:
        assert fast == expected
    assert _decoded_by_family(data) == expected


def _decoded_by_family(data: Any) -> object:
    try:
        return sample_data_from_dict(EventType.GPU_SAMPLE, data)
    except EventError as exc:
        return f"EventError: {exc}"


def test_a_common_sample_takes_the_fast_path():
    data = _valid()
    _checked_sample(data)  # the owners are known once a sample named them
    fast = _common_sample(data)
    assert fast is not None
    assert fast == _checked_sample(data)


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(sample_to_dict(a_sample(mig=a_mig())), id="a MIG slice"),
        pytest.param(_valid() | {"processes": ({"pid": 1, "used_memory_bytes": 0},)}, id="tuple"),
        pytest.param(_valid() | {"owner": {"team": ""}}, id="an empty owner"),
        pytest.param(_valid() | {"util_gpu_pct": True}, id="a bool for an integer"),
    ],
)
def test_what_the_fast_path_leaves_to_the_checked_decoder(data):
    assert _common_sample(data) is None
    assert _decoded_by_family(data) == _decoded(data)
