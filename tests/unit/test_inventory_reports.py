"""Collectors' inventory reports: one per node built from a round's samples (NVML's MIG GPUs,
dcgm-exporter's node labels and driver, each GPU's topology), and sent when they are due (first,
on change, every N intervals) by the real-time loop and the simulated fleet."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from collectors.dcgm import DcgmCollector
from collectors.dcgm_http import DcgmConfig
from collectors.inventory import (
    InventoryReporter,
    NodeFacts,
    nvml_versions,
    reports_from_samples,
)
from collectors.runner import RunPlan, run_simulated
from collectors.simulated import PoolSpec, SimulatedFleet, TeamSpec, WorkloadKind
from ledger.events import GpuSample, SampleSource
from ledger.inventory import decode_report_message, encode_record, fold_inventory
from ledger.topology import GpuTopology
from scheduler.inventory import FleetInventory
from scheduler.snapshot import Fleet
from tests.builders import GIB, INTERVAL_US, T0_US, a_mig, a_sample
from tests.unit.test_nvml_collector import collector, gpu_uuid, mixed_node
from tests.unit.test_runner import FakeClock, FakeSink, Reader, run


def _sample(uuid: str, index: int = 0, node: str = "node-01", **kw: object) -> GpuSample:
    return a_sample(gpu_uuid=uuid, gpu_index=index, node=node, **kw)


def test_one_report_per_node_each_gpu_once_and_mig_gpus_with_their_slices() -> None:
    samples = [
        _sample("GPU-b", 1),
        _sample("GPU-a", 0),
        _sample("GPU-m", 2, mig=a_mig("3g.40gb", 3, gi=2), memory_total_bytes=40 * GIB),
        _sample("GPU-m", 2, mig=a_mig("4g.40gb", 4, gi=1), memory_total_bytes=40 * GIB),
        _sample("GPU-z", 0, node="node-02"),
    ]
    one, two = reports_from_samples(samples, T0_US, INTERVAL_US, {"rack": "r1"}, ("550", "12.4"))
    assert (one.node, two.node) == ("node-01", "node-02")
    assert [g.uuid for g in one.gpus] == ["GPU-a", "GPU-b", "GPU-m"]
    mig = one.gpus[2]
    assert (mig.mig_mode, [m.gpu_instance_id for m in mig.mig]) == (True, [1, 2])
    assert mig.memory_total_bytes == 80 * GIB  # what its instances can hand out
    assert not one.gpus[0].mig_mode and one.gpus[0].memory_total_bytes == 80 * GIB
    assert (one.pool, one.labels, one.driver_version, one.cuda_version) == (
        "h100",
        (("rack", "r1"),),
        "550",
        "12.4",
    )


@dataclass
class Step:
    after_us: int  # since the previous round
    gpus: tuple[str, ...]
    periodic: bool
    sent: bool


SCHEDULES = {
    "first-round-then-every-three-intervals": [
        Step(0, ("GPU-a",), True, True),
        Step(INTERVAL_US, ("GPU-a",), True, False),
        Step(INTERVAL_US, ("GPU-a",), True, False),
        Step(INTERVAL_US, ("GPU-a",), True, True),
    ],
    "a-change-is-sent-at-once": [
        Step(0, ("GPU-a", "GPU-b"), True, True),
        Step(INTERVAL_US, ("GPU-a",), True, True),  # GPU-b answered nothing
        Step(INTERVAL_US, ("GPU-a", "GPU-b"), True, True),  # back
    ],
    "a-backfill-sends-only-first-and-changed": [
        Step(0, ("GPU-a",), False, True),
        Step(10 * INTERVAL_US, ("GPU-a",), False, False),
        Step(INTERVAL_US, ("GPU-a", "GPU-b"), False, True),
    ],
}


@pytest.mark.parametrize("steps", SCHEDULES.values(), ids=SCHEDULES.keys())
def test_reports_are_sent_when_due(steps: list[Step]) -> None:
    now = [T0_US]
    sent: list[tuple[bytes, bytes]] = []
    reporter = InventoryReporter(lambda k, v: sent.append((k, v)), 3, clock=lambda: now[0])
    for step in steps:
        now[0] += step.after_us
        before = len(sent)
        samples = [_sample(u, i) for i, u in enumerate(step.gpus)]
        reporter.after_round(samples, INTERVAL_US, periodic=step.periodic)
        assert (len(sent) > before) == step.sent
    key, value = sent[-1]
    (envelope,), dead = decode_report_message(value)
    assert (key, dead, envelope.data.time_us) == (b"node-01", [], now[0])


def test_the_real_time_loop_sends_the_reports_with_the_round() -> None:
    clock = FakeClock(T0_US - 1)
    reader = Reader(clock, stop_after=4, fail_on=set())
    sent: list[bytes] = []
    reporter = InventoryReporter(lambda k, v: sent.append(v), 2, clock=clock)
    run(reader, FakeSink(), reporter=reporter)
    times = [decode_report_message(v)[0][0].data.time_us for v in sent]
    # after rounds 1 and 3 (each read takes an interval of the clock): every two intervals
    assert times == [T0_US + INTERVAL_US, T0_US + 3 * INTERVAL_US]


def test_the_simulated_fleet_reports_its_nodes_at_wall_clock_time() -> None:
    fleet = SimulatedFleet(
        3,
        [PoolSpec("a100", "A100", 2, 4, 80)],
        [TeamSpec("vision", ("detection",))],
        [(WorkloadKind.TRAINING, 1)],
        INTERVAL_US,
    )
    wall = T0_US + 123
    sent: list[bytes] = []
    reporter = InventoryReporter(lambda k, v: sent.append(v), 2, clock=lambda: wall)
    plan = RunPlan(start_us=T0_US, backfill_us=5 * INTERVAL_US, speed=10.0, max_rounds=4)
    asyncio.run(run_simulated(fleet, FakeSink(), plan, asyncio.Event(), reporter=reporter))
    reports = [decode_report_message(v)[0][0].data for v in sent]
    assert sorted(r.node for r in reports) == ["a100-node-00", "a100-node-01"]  # once: backfill
    assert {(r.time_us, r.source, r.pool) for r in reports} == {
        (wall, SampleSource.SIMULATED, "a100")
    }
    assert {g.uuid for r in reports for g in r.gpus} == {g.uuid for g in fleet.gpus}
    assert {r.interval_us for r in reports} == {1_000_000}  # 10 s at speed 10, wall clock


def test_an_nvml_round_reports_its_mig_gpu_with_the_instances_it_sampled() -> None:
    fake = mixed_node()
    samples = collector(fake).collect_round().samples
    (report,) = reports_from_samples(samples, T0_US, INTERVAL_US)
    by_uuid = {g.uuid: g for g in report.gpus}
    mig = by_uuid[gpu_uuid(2)]
    assert (mig.mig_mode, sorted(m.profile for m in mig.mig)) == (
        True,
        ["1g.10gb", "2g.20gb", "3g.40gb"],
    )
    assert [g.index for g in report.gpus] == sorted(g.index for g in report.gpus)
    assert report.source is SampleSource.NVML and len(by_uuid) == len(fake.gpus)


def test_topology_goes_from_nvml_and_labels_through_the_inventory_to_the_scheduler() -> None:
    """NVML's NVLink domains and NUMA nodes, under the node's and per-GPU topology labels, reach
    the scheduler's placeable GPUs through the report, the fold and the `inventory` record."""
    nvml = collector(mixed_node())
    samples = nvml.collect_round().samples
    facts = {nvml.node: NodeFacts(topology=tuple(sorted(nvml.topology().items())))}
    sent: list[bytes] = []
    reporter = InventoryReporter(
        lambda k, v: sent.append(v),
        2,
        {"topology.rail": "r1", "topology.rack": "k1", "topology.numa_node": "x"},
        clock=lambda: T0_US,
        node_facts=facts,
        gpu_labels={"1": {"topology.rail": "r2"}, gpu_uuid(3): {"topology.nvlink_domain": "nv-x"}},
    )
    reporter.after_round(samples, INTERVAL_US)
    reports = [e.data for v in sent for e in decode_report_message(v)[0]]
    inventory = FleetInventory(stale_after_intervals=6)
    for record in fold_inventory(reports, {}).values():
        inventory.on_record(encode_record(record))
    fleet = Fleet.of(inventory.nodes(T0_US))
    assert {uuid: where.topology for uuid, where in fleet.where.items()} == {
        gpu_uuid(0): GpuTopology("node-1/nvlink0", 0, "r1", "k1"),
        gpu_uuid(1): GpuTopology("node-1/nvlink0", 0, "r2", "k1"),
        **{f"{gpu_uuid(2)}/gi{gi}": GpuTopology(None, 0, "r1", "k1") for gi in (1, 5, 13)},
        gpu_uuid(3): GpuTopology("nv-x", 1, "r1", "k1"),
    }  # a GPU in MIG mode is placed by instance, each where its GPU sits
    assert {where.node for where in fleet.where.values()} == {
        "node-1/NVIDIA A100-SXM4-80GB",
        *(f"node-1/NVIDIA A100-SXM4-80GB/{p}" for p in ("3g.40gb", "2g.20gb", "1g.10gb")),
        "node-1/Tesla V100-SXM2-32GB",
    }


class _Nvml:
    def __init__(self, driver: object, cuda: object) -> None:
        self.driver, self.cuda = driver, cuda

    def nvmlSystemGetDriverVersion(self) -> object:
        if isinstance(self.driver, Exception):
            raise self.driver
        return self.driver

    def nvmlSystemGetCudaDriverVersion(self) -> object:
        if isinstance(self.cuda, Exception):
            raise self.cuda
        return self.cuda


@pytest.mark.parametrize(
    ("nvml", "versions"),
    [
        pytest.param(_Nvml(b"550.54.15", 12040), ("550.54.15", "12.4"), id="bytes-and-12040"),
        pytest.param(_Nvml("535.1", 12020), ("535.1", "12.2"), id="text"),
        pytest.param(_Nvml(RuntimeError("no"), RuntimeError("no")), (None, None), id="none"),
    ],
)
def test_nvml_versions(nvml: _Nvml, versions: tuple[str | None, str | None]) -> None:
    assert nvml_versions(nvml) == versions


def _dcgm_row(gpu: int, **extra: str) -> str:
    labels = {
        "gpu": str(gpu),
        "UUID": f"GPU-{gpu}",
        "device": f"nvidia{gpu}",
        "modelName": "NVIDIA H100 80GB HBM3",
        "Hostname": "dgx-01",
        "DCGM_FI_DRIVER_VERSION": "550.90.07",
        **extra,
    }
    text = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return f"DCGM_FI_DEV_GPU_UTIL{{{text}}} 50\nDCGM_FI_DEV_FB_USED{{{text}}} 1024\n"


def test_dcgm_exporter_labels_common_to_a_node_and_its_driver_go_into_its_report() -> None:
    payload = _dcgm_row(0, cluster="c1", zone="a", pod="train-0", namespace="ml") + _dcgm_row(
        1, cluster="c1", zone="b"
    )
    scraped = DcgmCollector(DcgmConfig(url="http://x/metrics", pool="h100", node="x")).ingest(
        payload, T0_US
    )
    assert scraped.nodes == {"dgx-01": NodeFacts((("cluster", "c1"),), "550.90.07")}
    sent: list[bytes] = []
    reporter = InventoryReporter(
        lambda k, v: sent.append(v),
        2,
        {"rack": "r9"},
        clock=lambda: T0_US,
        node_facts=scraped.nodes,
    )
    reporter.after_round([e.data for e in scraped.envelopes], INTERVAL_US)
    (report,) = [decode_report_message(v)[0][0].data for v in sent]
    assert (report.labels, report.driver_version) == (
        (("cluster", "c1"), ("rack", "r9")),
        "550.90.07",
    )
    assert [g.uuid for g in report.gpus] == ["GPU-0", "GPU-1"]
