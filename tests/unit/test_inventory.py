"""The inventory fold, staleness and the two wire forms (node reports, topic records): pure
values in, values out."""

from __future__ import annotations

from dataclasses import dataclass, replace

import orjson
import pytest

from ledger.errors import EventError
from ledger.inventory import (
    GpuStatus,
    InventoryGpu,
    InventoryReport,
    decode_record,
    decode_report_message,
    encode_record,
    encode_report,
    fold_reports,
    record_from_json,
    record_id,
    record_json,
    status_of,
)
from ledger.topology import GpuTopology
from tests.builders import INTERVAL_US, T0_US
from tests.inventory_builders import a_gpu, a_mig_slice, a_record, a_report

LATER = T0_US + 3 * INTERVAL_US


# ---------------------------------------------------------------------------- the fold


@dataclass(frozen=True)
class FoldCase:
    current: tuple[InventoryGpu, ...]
    reports: tuple[InventoryReport, ...]
    changed: dict[str, tuple[int, int, str]]  # uuid → (first seen, last seen, node)


FOLDS = {
    "a-new-gpu-is-first-and-last-seen-at-its-report": FoldCase(
        (), (a_report(),), {"GPU-0": (T0_US, T0_US, "node-01")}
    ),
    "a-newer-report-moves-last-seen-only": FoldCase(
        (a_record(),), (a_report(at_us=LATER),), {"GPU-0": (T0_US, LATER, "node-01")}
    ),
    "the-same-report-again-changes-nothing": FoldCase((a_record(),), (a_report(),), {}),
    "an-older-report-only-moves-first-seen-back": FoldCase(
        (a_record(first_seen_us=LATER, last_seen_us=LATER),),
        (a_report(at_us=T0_US, pool="elsewhere"),),
        {"GPU-0": (T0_US, LATER, "node-01")},
    ),
    "a-gpu-moved-to-another-node-follows-the-newer-report": FoldCase(
        (a_record(),), (a_report("node-02", at_us=LATER),), {"GPU-0": (T0_US, LATER, "node-02")}
    ),
    "a-gpu-left-out-of-its-nodes-report-keeps-its-record": FoldCase(
        (a_record("GPU-0"), a_record("GPU-1", index=1)),
        (a_report("node-01", a_gpu("GPU-1", 1), at_us=LATER),),
        {"GPU-1": (T0_US, LATER, "node-01")},
    ),
    "reports-in-one-batch-fold-in-order": FoldCase(
        (),
        (a_report(at_us=LATER), a_report(at_us=T0_US)),
        {"GPU-0": (T0_US, LATER, "node-01")},
    ),
}


@pytest.mark.parametrize("case", FOLDS.values(), ids=FOLDS.keys())
def test_fold_reports(case: FoldCase) -> None:
    current = {g.uuid: g for g in case.current}
    changed = fold_reports(case.reports, current)
    assert {u: (g.first_seen_us, g.last_seen_us, g.node) for u, g in changed.items()} == (
        case.changed
    )
    again = fold_reports(case.reports, current | changed)
    assert again == {}  # folding the same reports again changes nothing


def test_a_newer_report_replaces_what_the_record_says() -> None:
    mig = a_gpu(mig_mode=True, mig=(a_mig_slice(1), a_mig_slice(2, "4g.40gb", 4)))
    (gpu,) = fold_reports(
        [a_report("node-01", mig, at_us=LATER, labels=(("zone", "b"),), driver_version=None)],
        {"GPU-0": a_record()},
    ).values()
    assert (gpu.mig_mode, [m.profile for m in gpu.mig]) == (True, ["3g.40gb", "4g.40gb"])
    assert (gpu.labels, gpu.driver_version, gpu.cuda_version) == ((("zone", "b"),), None, "12.4")
    assert gpu.health.value == "healthy"


# ---------------------------------------------------------------------------- staleness

STALENESS = {
    "just-reported": (T0_US, GpuStatus.LIVE),
    "silent-for-exactly-the-window": (T0_US + 6 * INTERVAL_US, GpuStatus.LIVE),
    "silent-one-microsecond-longer": (T0_US + 6 * INTERVAL_US + 1, GpuStatus.STALE),
    "a-clock-behind-the-report": (T0_US - INTERVAL_US, GpuStatus.LIVE),
}


@pytest.mark.parametrize(("now", "status"), STALENESS.values(), ids=STALENESS.keys())
def test_a_gpu_is_stale_after_n_silent_intervals(now: int, status: GpuStatus) -> None:
    assert status_of(T0_US, INTERVAL_US, now, 6) is status


# ---------------------------------------------------------------------------- the wire


def test_a_report_round_trips_through_its_envelope() -> None:
    report = a_report(
        "node-01",
        a_gpu(mig_mode=True, mig=(a_mig_slice(),), topology=GpuTopology("nv-1", 0, "r1", "k1")),
        a_gpu("GPU-1", 1),
    )
    envelopes, dead = decode_report_message(encode_report(report))
    assert dead == [] and [e.data for e in envelopes] == [report]
    assert (envelopes[0].subject, envelopes[0].time_us) == ("node-01", T0_US)
    gpus = orjson.loads(encode_report(report))["data"]["gpus"]
    assert [g.get("topology") for g in gpus] == [
        {"nvlink_domain": "nv-1", "numa_node": 0, "rail": "r1", "rack": "k1"},
        None,  # unknown topology is not written: the report is what it always was
    ]


def _report_with(**data: object) -> bytes:
    message = orjson.loads(encode_report(a_report()))
    message["data"].update(data)
    return orjson.dumps(message)


GPU_DATA = orjson.loads(encode_report(a_report()))["data"]["gpus"][0]
BAD_REPORTS = {
    "a-float-index": (_report_with(gpus=[{**GPU_DATA, "index": 1.0}]), "index"),
    "an-unknown-source": (_report_with(source="ipmi"), "source"),
    "a-gpu-twice": (
        _report_with(gpus=[GPU_DATA, GPU_DATA]),
        "appears twice",
    ),
    "a-label-that-is-not-text": (_report_with(labels={"rack": 7}), "labels"),
    "a-zero-interval": (_report_with(interval_us=0), "interval_us"),
    "a-float-numa-node": (
        _report_with(gpus=[{**GPU_DATA, "topology": {"numa_node": 1.0}}]),
        "numa_node",
    ),
    "an-unknown-topology-key": (
        _report_with(gpus=[{**GPU_DATA, "topology": {"switch": "s1"}}]),
        "topology",
    ),
    "an-empty-rail": (_report_with(gpus=[{**GPU_DATA, "topology": {"rail": ""}}]), "rail"),
}


@pytest.mark.parametrize(("value", "field"), BAD_REPORTS.values(), ids=BAD_REPORTS.keys())
def test_a_bad_report_is_a_dead_letter_naming_the_field(value: bytes, field: str) -> None:
    envelopes, dead = decode_report_message(value)
    assert envelopes == [] and len(dead) == 1 and field in dead[0].reason


def test_a_record_round_trips_and_its_id_follows_its_content() -> None:
    record = a_record(mig_mode=True, mig=(a_mig_slice(),), labels=(("rack", "r1"),))
    assert decode_record(encode_record(record)) == record
    placed = replace(record, topology=GpuTopology(nvlink_domain="nv-1", numa_node=3))
    assert decode_record(encode_record(placed)) == placed
    assert b"topology" not in encode_record(record)  # its id is what it was before topology
    assert record_from_json(record_json(record)) == record
    assert record_id(record) == record_id(replace(record))
    assert record_id(record) != record_id(replace(record, last_seen_us=LATER))


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(b"not json", id="not-json"),
        pytest.param(orjson.dumps({"type": "tally.balance", "data": {}}), id="another-type"),
        pytest.param(
            encode_record(a_record()).replace(b'"subject":"GPU-0"', b'"subject":"GPU-9"'),
            id="subject-is-not-the-uuid",
        ),
    ],
)
def test_a_record_that_is_not_one_is_refused(value: bytes) -> None:
    with pytest.raises(EventError):
        decode_record(value)
