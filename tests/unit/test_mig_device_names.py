"""A MIG job's `CUDA_VISIBLE_DEVICES` names each instance by the MIG device's own UUID: read by
the NVML collector off the MIG device handle (`nvmlDeviceGetUUID`), carried in the samples and
inventory reports, folded into the inventory record the scheduler reads, and mapped by the
scheduler's device map — falling back to `MIG-<GPU UUID>/<gi>/<ci>` only where the instance's
UUID is unknown (dcgm-exporter does not expose it; a driver before R470 answers that form)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from collectors.fake_nvml import FakeNvml, fake_mig_uuid, gpu_uuid, mig_gpu
from collectors.inventory import reports_from_samples
from ledger.errors import EventError
from ledger.events import MigInstance, decode_message, encode_batch, envelope_for
from ledger.inventory.events import decode_report_message, encode_report
from ledger.inventory.state import encode_record, fold_reports
from ledger.mig_devices import mig_uuid
from scheduler.executors.launch import visible_devices
from scheduler.inventory import FleetInventory
from scheduler.model import Flavor, GpuRef, RunningJob
from tests.builders import T0_US
from tests.scheduler_builders import a_spec
from tests.unit.test_nvml_collector import collector

GPU = gpu_uuid(0)


@dataclass(frozen=True)
class NameCase:
    legacy: bool  # the driver names MIG devices as before R470
    own: str  # FakeMig.uuid ("": the fake derives one)
    expected: tuple[str, ...]  # CUDA_VISIBLE_DEVICES of a job on gi 5 then gi 1


CASES = {
    "r470-plus-derived-uuids": NameCase(
        False, "", (fake_mig_uuid(GPU, 5, 0), fake_mig_uuid(GPU, 1, 0))
    ),
    "r470-plus-given-uuid": NameCase(
        False,
        "MIG-1f2e3d4c-0000-5000-8000-00000000abcd",
        ("MIG-1f2e3d4c-0000-5000-8000-00000000abcd", fake_mig_uuid(GPU, 1, 0)),
    ),
    "before-r470-the-gpu-uuid-form": NameCase(True, "", (f"MIG-{GPU}/5/0", f"MIG-{GPU}/1/0")),
}


def fleet_after_one_round(fake: FakeNvml) -> FleetInventory:
    """One collector round through the wire formats: samples encoded and decoded, the report
    from them encoded and decoded, folded into records, each record through the topic's
    encoding into the scheduler's inventory."""
    collected = list(collector(fake).collect_round().samples)
    envelopes, dead = decode_message(
        encode_batch(envelope_for(s, "nvml://node-1") for s in collected)
    )
    samples = [e.data for e in envelopes]
    assert not dead and samples == collected
    reports = reports_from_samples(samples, T0_US, 10_000_000)
    read = [e.data for r in reports for e in decode_report_message(encode_report(r))[0]]
    inventory = FleetInventory(stale_after_intervals=6)
    for record in fold_reports(read, {}).values():
        inventory.on_record(encode_record(record))
    return inventory


def job_on(*instances: int) -> RunningJob:
    return RunningJob(
        spec=a_spec(gpus=len(instances), mig_profile="3g.40gb"),
        flavor=Flavor("a100", "A100/3g.40gb"),
        gpus=tuple(GpuRef(f"{GPU}/gi{i}", "node-1/A100/3g.40gb") for i in instances),
        priority=0,
        preemptible=True,
        admitted_us=0,
        attempt=1,
    )


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_a_mig_job_sees_its_instances_by_their_device_names(case: NameCase) -> None:
    gpu = mig_gpu(GPU, [(1, "3g.40gb", 3), (5, "3g.40gb", 3)], legacy_mig_uuids=case.legacy)
    gpu.migs[1].uuid = case.own
    inventory = fleet_after_one_round(FakeNvml([gpu]))
    assert visible_devices(job_on(5, 1), inventory.device_ids) == case.expected


def test_an_instance_whose_uuid_is_unknown_falls_back_to_the_gpu_uuid_form() -> None:
    """dcgm-exporter reports no MIG device UUID (only GPU_I_ID / GPU_I_PROFILE): the instance is
    named `MIG-<GPU UUID>/<gi>/<ci>`, as is one the scheduler has no device map entry for."""
    gpu = mig_gpu(GPU, [(1, "3g.40gb", 3), (5, "3g.40gb", 3)])
    inventory = fleet_after_one_round(FakeNvml([gpu]))
    record = inventory.gpus[GPU]
    assert all(m.uuid is not None and m.uuid.startswith("MIG-") for m in record.mig)
    unknown = MigInstance(5, 0, "3g.40gb", 3, 7)  # as the DCGM parser gives it
    assert unknown.uuid is None
    assert visible_devices(job_on(5), {}) == (f"MIG-{GPU}/5/0",)


@pytest.mark.parametrize(
    "uuid",
    ["GPU-0000", "", "MIG-" + "x" * 300, 7],
    ids=["a-gpu-uuid", "empty", "too-long", "not-a-string"],
)
def test_an_event_with_a_bad_mig_uuid_is_refused(uuid: object) -> None:
    with pytest.raises(EventError):
        mig_uuid(uuid)
