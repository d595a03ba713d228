"""NvmlCollector scenarios on the fake NVML: MIG, churn, unsupported fields, lost GPUs, counters."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import fields
from typing import Any

import pynvml
import pytest

from collectors.errors import NvmlUnavailableError
from collectors.fake_nvml import (
    GIB,
    FakeGpu,
    FakeHandle,
    FakeMig,
    FakeNvml,
    FakeProcess,
    gpu_uuid,
    mig_gpu,
    mixed_node,
)
from collectors.nvml import NvmlCollector, RoundResult
from ledger.events import (
    GpuSample,
    HealthKind,
    Owner,
    SampleSource,
    decode_message,
    encode_batch,
    envelope_for,
)

T0 = 1_793_491_200_000_000
STEP_US = 10_000_000


def stepping_clock(step_us: int = STEP_US) -> Callable[[], int]:
    ticks = itertools.count(T0, step_us)
    return lambda: next(ticks)


def collector(fake: FakeNvml, **kwargs: object) -> NvmlCollector:
    kwargs.setdefault("clock", stepping_clock())
    return NvmlCollector(fake, "node-1", "a100", **kwargs)  # type: ignore[arg-type]


def rounds(c: NvmlCollector, fake: FakeNvml, n: int) -> list[RoundResult]:
    out = []
    for _ in range(n):
        out.append(c.collect_round())
        fake.tick(10)
    return out


def by_subject(result: RoundResult) -> dict[str, GpuSample]:
    return {s.subject: s for s in result.samples}


def assert_integers_only(sample: GpuSample) -> None:
    for f in fields(sample):
        value = getattr(sample, f.name)
        assert not isinstance(value, float), f.name
    for p in sample.processes:
        assert type(p.pid) is int and type(p.used_memory_bytes) is int
        assert p.sm_util_pct is None or type(p.sm_util_pct) is int


# ---------------------------------------------------------------------------- configuration


@pytest.mark.parametrize("interval", [0.0, 0.5, 0.999, -1.0, float("nan"), float("inf"), 7200.0])
def test_interval_is_validated(interval: float) -> None:
    with pytest.raises(ValueError, match="sampling interval"):
        NvmlCollector(mixed_node(), "n", "p", interval_s=interval)


def test_interval_default_and_minimum() -> None:
    assert NvmlCollector(mixed_node(), "n", "p").interval_us == 10_000_000
    assert NvmlCollector(mixed_node(), "n", "p", interval_s=1).interval_us == 1_000_000


def test_source_name() -> None:
    assert NvmlCollector(mixed_node(), "gpu-07", "p").source == "nvml://gpu-07"


# ---------------------------------------------------------------------------- start


@pytest.mark.parametrize(
    ("code", "words"),
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "libnvidia-ml.so.1"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "kernel driver is not loaded"),
        (pynvml.NVML_ERROR_UNINITIALIZED, "could not be initialised"),
        (pynvml.NVML_ERROR_NO_PERMISSION, "/dev/nvidia"),
        (pynvml.NVML_ERROR_UNKNOWN, "NVML could not start"),
    ],
)
def test_start_failures_are_one_clear_error(code: int, words: str) -> None:
    fake = FakeNvml([FakeGpu(gpu_uuid(0))], init_error=code)
    c = collector(fake)
    with pytest.raises(NvmlUnavailableError, match=words) as info:
        c.collect_round()
    assert isinstance(info.value.__cause__, pynvml.NVMLError)
    assert info.value.__cause__.value == code


def test_no_gpu_is_unavailable_and_releases_nvml() -> None:
    fake = FakeNvml([])
    with pytest.raises(NvmlUnavailableError, match="no GPU"):
        collector(fake).start()
    assert fake.initialised == 0


def test_real_library_without_driver_is_a_clear_error() -> None:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("an NVIDIA driver is present")
    with pytest.raises(NvmlUnavailableError) as info:
        NvmlCollector(pynvml, "n", "p").start()
    assert "NVIDIA" in str(info.value)


def test_context_manager_shuts_down() -> None:
    fake = mixed_node()
    with collector(fake) as c:
        c.collect_round()
        assert fake.initialised == 1
    assert fake.initialised == 0
    assert fake.calls["nvmlEventSetFree"] == 1


# ---------------------------------------------------------------------------- a mixed node


def test_mixed_node_round() -> None:
    fake = mixed_node()
    c = collector(fake)
    first, second = rounds(c, fake, 2)
    # 2 plain + 3 MIG instances + their GPU's unconfigured slice + 1 old GPU
    assert len(first.samples) == 7
    for sample in first.samples:
        assert_integers_only(sample)
        assert sample.source is SampleSource.NVML
        assert sample.node == "node-1" and sample.pool == "a100"
        assert sample.sample_time_us == T0 and sample.interval_us == STEP_US
    s = by_subject(first)
    busy = s[gpu_uuid(0)]
    assert (busy.util_gpu_pct, busy.util_mem_pct) == (93, 40)
    assert busy.memory_used_bytes == 30 * GIB and busy.memory_total_bytes == 80 * GIB
    assert busy.power_mw == 350_000 and busy.temperature_c == 35 and busy.sm_clock_mhz == 1410
    assert busy.model == "NVIDIA A100-SXM4-80GB" and busy.mig is None
    assert [(p.pid, p.used_memory_bytes, p.sm_util_pct) for p in busy.processes] == [
        (1001, 20 * GIB, 60),
        (1002, 10 * GIB, 30),
    ]
    assert busy.xid_errors == 0
    old = s[gpu_uuid(3)]
    assert old.energy_mj is None and old.mig is None and old.util_gpu_pct == 0
    # Each problem is reported once, in the round it was found.
    assert any("energy: unsupported" in p for p in first.problems)
    assert second.problems == ()
    assert by_subject(second)[gpu_uuid(0)].interval_us == STEP_US


def test_mig_instances_one_sample_each_with_their_processes() -> None:
    fake = mixed_node()
    s = by_subject(collector(fake).collect_round())
    parent = gpu_uuid(2)
    three, two, one = s[f"{parent}/gi1"], s[f"{parent}/gi5"], s[f"{parent}/gi13"]
    assert three.mig is not None and two.mig is not None and one.mig is not None
    assert (three.mig.profile, three.mig.slices, three.mig.total_slices) == ("3g.40gb", 3, 7)
    assert (two.mig.profile, two.mig.slices) == ("2g.20gb", 2)
    assert (one.mig.profile, one.mig.slices) == ("1g.10gb", 1)
    assert [p.pid for p in three.processes] == [3001]
    assert [p.pid for p in two.processes] == [3002]
    assert one.processes == ()
    assert three.memory_used_bytes == 18 * GIB and three.memory_total_bytes == 40 * GIB
    assert three.model == "NVIDIA A100-SXM4-80GB"  # the parent's model, for pricing
    # The documented MIG rule: no per-process samples on MIG, so utilisation is occupancy.
    assert three.processes[0].sm_util_pct is None
    assert (three.util_gpu_pct, two.util_gpu_pct, one.util_gpu_pct) == (100, 100, 0)
    assert three.util_mem_pct is None
    # Power is apportioned by slices.
    assert three.power_mw == 210_000 * 3 // 7 and one.power_mw == 210_000 // 7


def test_mig_energy_is_apportioned_and_monotonic() -> None:
    fake = mixed_node()
    c = collector(fake)
    results = rounds(c, fake, 4)
    parent = gpu_uuid(2)
    series = {
        gi: [by_subject(r)[f"{parent}/gi{gi}"].energy_mj for r in results] for gi in (1, 5, 13)
    }
    deltas = {gi: [b - a for a, b in itertools.pairwise(v)] for gi, v in series.items()}  # type: ignore[operator]
    parent_delta = 210_000 * 10  # mW × 10 s = mJ per round
    for i in range(3):
        share = sum(deltas[gi][i] for gi in (1, 5, 13))
        assert 0 <= parent_delta * 6 // 7 - share <= 3  # 6 of 7 slices are carved out
    assert all(d >= 0 for v in deltas.values() for d in v)


def test_mig_with_per_process_samples_uses_their_sum() -> None:
    fake = mixed_node()

    def utils(handle: FakeHandle, timestamp: int) -> list[Any]:
        sample = pynvml.c_nvmlProcessUtilizationSample_t()
        sample.pid, sample.timeStamp, sample.smUtil = 3001, fake.now_us, 35
        return [sample]

    fake.nvmlDeviceGetProcessUtilization = utils  # type: ignore[method-assign]
    s = by_subject(collector(fake).collect_round())
    three = s[f"{gpu_uuid(2)}/gi1"]
    assert three.processes[0].sm_util_pct == 35 and three.util_gpu_pct == 35
    two = s[f"{gpu_uuid(2)}/gi5"]
    assert two.processes[0].sm_util_pct == 0 and two.util_gpu_pct == 0


def test_mig_layout_change_is_picked_up_in_the_same_round() -> None:
    fake = mixed_node()
    c = collector(fake)
    c.collect_round()
    gpu = fake.gpus[2]
    gpu.migs[3] = FakeMig(gi=9, ci=0, profile="1g.10gb", slices=1, memory_total=10 * GIB)
    fake.add_process(2, FakeProcess(3009, 2 * GIB, None, gi=9, ci=0))
    s = by_subject(c.collect_round())
    assert [p.pid for p in s[f"{gpu_uuid(2)}/gi9"].processes] == [3009]


def test_mig_mode_switch_changes_the_sample_shape() -> None:
    fake = mixed_node()
    c = collector(fake)
    assert f"{gpu_uuid(2)}/gi1" in by_subject(c.collect_round())
    gpu = fake.gpus[2]
    gpu.mig_enabled, gpu.migs, gpu.processes = False, {}, [FakeProcess(3100, GIB, 10)]
    gpu.util_gpu = 12
    fake.tick(10)
    s = by_subject(c.collect_round())
    whole = s[gpu_uuid(2)]
    assert whole.mig is None and whole.util_gpu_pct == 12
    assert [p.pid for p in whole.processes] == [3100]


def test_mig_compute_instances_of_one_gpu_instance_are_merged() -> None:
    gpu = mig_gpu(gpu_uuid(0), [(2, "3g.40gb", 3)])
    gpu.migs[1] = FakeMig(gi=2, ci=1, profile="1c.3g.40gb", slices=3, memory_total=40 * GIB)
    gpu.processes = [FakeProcess(1, GIB, 1, gi=2, ci=0), FakeProcess(2, GIB, 1, gi=2, ci=1)]
    fake = FakeNvml([gpu])
    result = collector(fake).collect_round()
    assert [s.subject for s in result.samples] == [f"{gpu_uuid(0)}/gi2", f"{gpu_uuid(0)}/gi65535"]
    sample = result.samples[0]
    assert sample.mig is not None and sample.mig.compute_instance_id == 0
    assert [p.pid for p in sample.processes] == [1, 2]


def test_mig_without_parent_privileges_asks_each_instance() -> None:
    fake = mixed_node()
    fake.gpus[2].no_permission.add("nvmlDeviceGetComputeRunningProcesses")
    c = collector(fake)
    first = c.collect_round()
    s = by_subject(first)
    assert [p.pid for p in s[f"{gpu_uuid(2)}/gi1"].processes] == [3001]
    assert [p.pid for p in s[f"{gpu_uuid(2)}/gi5"].processes] == [3002]
    assert sum("no permission" in p for p in first.problems) == 1
    fake.tick(10)
    assert c.collect_round().problems == ()


def test_mig_gpu_with_no_instances_is_sampled_whole() -> None:
    fake = FakeNvml([mig_gpu(gpu_uuid(0), [])])
    (sample,) = collector(fake).collect_round().samples
    assert sample.mig is None and sample.util_gpu_pct == 0 and sample.processes == ()


def test_a30_has_four_slices() -> None:
    gpu = mig_gpu(gpu_uuid(0), [(1, "2g.12gb", 2)], name="NVIDIA A30", total_slices=4)
    sample, spare = collector(FakeNvml([gpu])).collect_round().samples
    assert sample.mig is not None and (sample.mig.slices, sample.mig.total_slices) == (2, 4)
    assert spare.mig is not None and (spare.mig.slices, spare.mig.total_slices) == (2, 4)


# ---------------------------------------------------------------------------- processes


def test_processes_appearing_and_leaving_with_cached_owners() -> None:
    fake = mixed_node()
    asked: list[tuple[int, str]] = []

    def resolver(pid: int, uuid: str) -> Owner | None:
        asked.append((pid, uuid))
        return Owner(team="vision", job_id=f"job-{pid}")

    c = collector(fake, owner_resolver=resolver)
    c.collect_round()
    fake.tick(10)
    assert sorted(pid for pid, _ in asked) == [1001, 1002, 2001, 3001, 3002]
    fake.add_process(0, FakeProcess(1003, GIB, 5))
    fake.remove_process(0, 1002)
    fake.tick(10)
    s = by_subject(c.collect_round())
    busy = s[gpu_uuid(0)]
    assert [p.pid for p in busy.processes] == [1001, 1003]
    assert busy.processes[1].owner == Owner(team="vision", job_id="job-1003")
    assert [pid for pid, _ in asked].count(1001) == 1  # cached while it stays
    assert [pid for pid, _ in asked].count(1003) == 1
    fake.add_process(0, FakeProcess(1002, GIB, 5))  # back again: asked again
    fake.tick(10)
    c.collect_round()
    assert [pid for pid, _ in asked].count(1002) == 2


def test_owners_are_refreshed_periodically() -> None:
    fake = FakeNvml([FakeGpu(gpu_uuid(0), processes=[FakeProcess(7)])])
    calls: list[int] = []

    def resolver(pid: int, uuid: str) -> Owner | None:
        calls.append(pid)
        return None

    c = collector(fake, owner_resolver=resolver, owner_refresh_rounds=2)
    rounds(c, fake, 5)
    assert len(calls) == 3  # rounds 1, 3, 5


def test_a_failing_owner_resolver_does_not_stop_sampling() -> None:
    fake = mixed_node()

    def broken(pid: int, uuid: str) -> Owner | None:
        raise RuntimeError("registry down")

    result = collector(fake, owner_resolver=broken).collect_round()
    assert len(result.samples) == 7
    assert all(p.owner is None for s in result.samples for p in s.processes)
    assert sum("owner lookup failed" in p for p in result.problems) == 1


def test_process_memory_unknown_is_zero() -> None:
    fake = FakeNvml([FakeGpu(gpu_uuid(0), processes=[FakeProcess(7, used_memory=None)])])
    (sample,) = collector(fake).collect_round().samples
    assert sample.processes[0].used_memory_bytes == 0


# ---------------------------------------------------------------------------- process utilisation


def test_last_seen_timestamp_comes_from_the_previous_round() -> None:
    fake = mixed_node()
    c = collector(fake)
    c.collect_round()
    first_ts = fake.now_us  # the newest sample the first round saw
    fake.tick(10)
    c.collect_round()
    second_ts = fake.now_us
    fake.tick(10)
    c.collect_round()
    assert fake.process_util_timestamps[0] == [0, first_ts, second_ts]


def test_several_samples_of_a_process_are_averaged_and_silent_processes_are_idle() -> None:
    fake = FakeNvml([FakeGpu(gpu_uuid(0), processes=[FakeProcess(1, sm_util=10)])])
    c = collector(fake)
    fake.tick(1)
    c.collect_round()
    fake.gpus[0].processes[0].sm_util = 30
    fake.tick(5)
    fake.gpus[0].processes[0].sm_util = 50
    fake.tick(5)
    fake.add_process(0, FakeProcess(2, sm_util=None))  # runs no kernels: no samples
    (sample,) = c.collect_round().samples
    assert [(p.pid, p.sm_util_pct) for p in sample.processes] == [(1, 40), (2, 0)]


def test_no_samples_is_no_data_not_a_problem() -> None:
    fake = FakeNvml([FakeGpu(gpu_uuid(0), processes=[FakeProcess(1, sm_util=None)])])
    result = collector(fake).collect_round()
    assert result.samples[0].processes[0].sm_util_pct == 0
    assert result.problems == ()


# ---------------------------------------------------------------------------- unsupported fields


def test_not_supported_fields_are_none_and_not_asked_again() -> None:
    fake = mixed_node()
    fake.gpus[1].unsupported |= {
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetTemperature",
        "nvmlDeviceGetClockInfo",
        "nvmlDeviceGetUtilizationRates",
    }
    c = collector(fake)
    results = rounds(c, fake, 3)
    for r in results:
        half = by_subject(r)[gpu_uuid(1)]
        assert (half.power_mw, half.temperature_c, half.sm_clock_mhz) == (None, None, None)
        assert half.util_gpu_pct == 45  # from its one process's SM utilisation
        assert half.util_mem_pct is None
        assert by_subject(r)[gpu_uuid(0)].power_mw == 350_000  # the others are unaffected
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 3 + 3 + 3 + 1  # GPU 1 asked only once
    assert len(results[0].problems) >= 4 and results[1].problems == ()


def test_no_permission_is_reported_once() -> None:
    fake = mixed_node()
    fake.gpus[0].no_permission.add("nvmlDeviceGetTotalEnergyConsumption")
    results = rounds(collector(fake), fake, 3)
    assert [sum("no permission" in p for p in r.problems) for r in results] == [1, 0, 0]
    assert all(by_subject(r)[gpu_uuid(0)].energy_mj is None for r in results)


def test_transient_errors_leave_the_field_empty_for_that_round_only() -> None:
    fake = mixed_node()
    c = collector(fake)
    original = fake.nvmlDeviceGetTemperature
    failing = [True]

    def flaky(handle: FakeHandle, sensor: int) -> int:
        if failing[0]:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
        return original(handle, sensor)

    fake.nvmlDeviceGetTemperature = flaky  # type: ignore[method-assign]
    first = c.collect_round()
    assert by_subject(first)[gpu_uuid(0)].temperature_c is None
    failing[0] = False
    fake.tick(10)
    assert by_subject(c.collect_round())[gpu_uuid(0)].temperature_c == 35


def test_out_of_range_readings_are_dropped() -> None:
    fake = FakeNvml(
        [FakeGpu(gpu_uuid(0), temperature_c=4000, sm_clock_mhz=0xFFFFFFFF, util_gpu=250)]
    )
    (sample,) = collector(fake).collect_round().samples
    assert (sample.temperature_c, sample.sm_clock_mhz, sample.util_gpu_pct) == (None, None, 100)


# ---------------------------------------------------------------------------- lost GPUs


def test_gpu_lost_mid_run_then_recovered() -> None:
    fake = mixed_node()
    c = collector(fake)
    r1 = c.collect_round()
    fake.tick(10)
    fake.gpus[1].lost = True
    r2 = c.collect_round()
    fake.tick(10)
    r3 = c.collect_round()
    fake.tick(10)
    fake.gpus[1].lost = False
    r4 = c.collect_round()
    fake.tick(10)
    r5 = c.collect_round()
    assert gpu_uuid(1) in by_subject(r1)
    (lost,) = r2.health
    assert (lost.kind, lost.gpu_uuid, lost.gpu_index) == (HealthKind.GPU_LOST, gpu_uuid(1), 1)
    assert "GPU is lost" in lost.detail
    for r in (r2, r3):
        assert gpu_uuid(1) not in by_subject(r)
        assert len(r.samples) == 6  # the others (and the spare MIG slice) are still sampled
    assert r3.health == ()
    (back,) = r4.health
    assert (back.kind, back.gpu_uuid) == (HealthKind.RECOVERED, gpu_uuid(1))
    assert by_subject(r4)[gpu_uuid(1)].interval_us == STEP_US  # the gap is not guessed at
    assert r5.health == ()


def test_mig_gpu_lost_while_reading_an_instance() -> None:
    fake = mixed_node()
    c = collector(fake)
    c.collect_round()
    original = fake.nvmlDeviceGetMemoryInfo

    def lost_on_mig(handle: object) -> object:
        if getattr(handle, "mig", None) is not None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return original(handle)  # type: ignore[arg-type]

    fake.nvmlDeviceGetMemoryInfo = lost_on_mig  # type: ignore[method-assign]
    fake.tick(10)
    r = c.collect_round()
    assert [h.kind for h in r.health] == [HealthKind.GPU_LOST]
    assert not any(s.gpu_uuid == gpu_uuid(2) for s in r.samples)


def test_gpu_lost_at_start_joins_when_it_answers() -> None:
    fake = mixed_node()
    fake.gpus[3].lost = True
    c = collector(fake)
    first = c.collect_round()
    assert gpu_uuid(3) not in by_subject(first) and first.health == ()
    assert any("GPU 3 cannot be read" in p for p in first.problems)
    fake.gpus[3].lost = False
    fake.tick(10)
    second = c.collect_round()
    assert second.health == ()  # it was never announced, so nothing recovers
    assert by_subject(second)[gpu_uuid(3)].model == "Tesla V100-SXM2-32GB"


def test_a_different_gpu_at_a_lost_index_is_sampled_as_itself() -> None:
    fake = mixed_node()
    c = collector(fake)
    c.collect_round()
    fake.gpus[1].lost = True
    fake.tick(10)
    c.collect_round()
    fake.gpus[1].lost = False
    fake.gpus[1].uuid = "GPU-replacement"
    fake.tick(10)
    r = c.collect_round()
    assert "GPU-replacement" in by_subject(r)
    assert any("now answers as GPU-replacement" in p for p in r.problems)


# ---------------------------------------------------------------------------- energy counter


@pytest.mark.parametrize("after", [0, 500, 7])
def test_energy_counter_reset_never_goes_backwards(after: int) -> None:
    fake = FakeNvml([FakeGpu(gpu_uuid(0), power_mw=100_000, energy_mj=5_000_000)])
    c = collector(fake)
    e1 = c.collect_round().samples[0].energy_mj
    fake.tick(10)
    e2 = c.collect_round().samples[0].energy_mj
    fake.gpus[0].energy_mj = after  # driver reload / GPU reset / wrap
    r3 = c.collect_round()
    e3 = r3.samples[0].energy_mj
    fake.tick(10)
    e4 = c.collect_round().samples[0].energy_mj
    assert (e1, e2) == (5_000_000, 6_000_000)
    assert e2 is not None and e3 is not None
    assert e3 == e2 + after  # energy since the restart is what the counter says now
    assert e4 == e3 + 1_000_000
    assert any("energy counter went back" in p for p in r3.problems)


def test_energy_wrap_of_a_64_bit_counter() -> None:
    top = (1 << 64) - 1_000
    fake = FakeNvml([FakeGpu(gpu_uuid(0), power_mw=100_000, energy_mj=top)])
    c = collector(fake)
    c.collect_round()
    fake.gpus[0].energy_mj = 2_000  # wrapped
    e = c.collect_round().samples[0].energy_mj
    assert e is not None and e == top + 2_000


# ---------------------------------------------------------------------------- XID errors


def test_xid_events_become_health_events_and_counts() -> None:
    fake = mixed_node()
    c = collector(fake)
    c.collect_round()
    fake.inject_xid(0, 48)
    fake.inject_xid(0, 63)
    fake.inject_xid(2, 94, gi=5)
    fake.tick(10)
    r = c.collect_round()
    assert sorted((h.gpu_index, h.xid) for h in r.health) == [(0, 48), (0, 63), (2, 94)]
    assert all(h.kind is HealthKind.XID_ERROR for h in r.health)
    s = by_subject(r)
    assert s[gpu_uuid(0)].xid_errors == 2 and s[gpu_uuid(1)].xid_errors == 0
    assert s[f"{gpu_uuid(2)}/gi5"].xid_errors == 1 and s[f"{gpu_uuid(2)}/gi1"].xid_errors == 0
    fake.tick(10)
    assert c.collect_round().health == ()
    assert fake.calls["nvmlEventSetWait"] == 1 + (3 + 1) + 1  # drained until Timeout


def test_gpu_without_xid_events_reports_none() -> None:
    fake = FakeNvml([FakeGpu(gpu_uuid(0), xid_supported=False), FakeGpu(gpu_uuid(1))])
    samples = collector(fake).collect_round().samples
    assert [s.xid_errors for s in samples] == [None, 0]


# ---------------------------------------------------------------------------- time


def test_interval_is_capped_after_a_stall_and_a_stuck_clock_skips() -> None:
    times = iter([T0, T0 + 10 * 60 * 1_000_000, T0 + 10 * 60 * 1_000_000])
    fake = FakeNvml([FakeGpu(gpu_uuid(0))])
    c = collector(fake, clock=lambda: next(times))
    c.collect_round()
    (late,) = c.collect_round().samples
    assert late.interval_us == 3 * STEP_US
    stuck = c.collect_round()
    assert stuck.samples == () and any("clock" in p for p in stuck.problems)


# ---------------------------------------------------------------------------- the wire


def test_samples_survive_the_event_codec() -> None:
    fake = mixed_node()
    c = collector(fake, owner_resolver=lambda pid, uuid: Owner(team="t", job_id=f"j{pid}"))
    result = c.collect_round()
    envelopes = [envelope_for(s, c.source) for s in result.samples]
    decoded, dead = decode_message(encode_batch(envelopes))
    assert dead == []
    assert [e.data for e in decoded] == list(result.samples)
    assert len({e.id for e in decoded}) == len(envelopes)


def test_old_bindings_returning_bytes_are_decoded() -> None:
    fake = FakeNvml([FakeGpu(gpu_uuid(0))])
    uuid, name = fake.nvmlDeviceGetUUID, fake.nvmlDeviceGetName
    fake.nvmlDeviceGetUUID = lambda h: uuid(h).encode()  # type: ignore[method-assign, assignment, return-value]
    fake.nvmlDeviceGetName = lambda h: name(h).encode()  # type: ignore[method-assign, assignment, return-value]
    (sample,) = collector(fake).collect_round().samples
    assert (sample.gpu_uuid, sample.model) == (gpu_uuid(0), "NVIDIA A100-SXM4-80GB")


def test_a_partly_carved_mig_gpu_is_fully_accounted_for() -> None:
    """3g + 2g + 1g of 7 slices: the spare slice is sampled as unallocated capacity."""
    from ledger.attribution import UNCONFIGURED_PROFILE, physical_gpu_ms

    result = collector(mixed_node()).collect_round()
    parent = [s for s in result.samples if s.gpu_uuid == gpu_uuid(2)]
    assert sum(s.mig.slices for s in parent if s.mig) == 7
    spare = next(s for s in parent if s.mig and s.mig.profile == UNCONFIGURED_PROFILE)
    assert spare.processes == () and spare.owner is None and spare.util_gpu_pct == 0
    assert sum(physical_gpu_ms(s) for s in parent) in range(
        STEP_US // 1000 - 3, STEP_US // 1000 + 4
    )


def test_energy_used_per_interval_is_reported_and_a_mig_gpu_loses_none_of_it() -> None:
    fake = mixed_node()
    c = collector(fake)
    first, second = rounds(c, fake, 2)
    assert all(s.energy_delta_mj is None for s in first.samples)  # nothing to rise from yet
    whole = by_subject(second)[gpu_uuid(0)]
    assert whole.energy_delta_mj == 350_000 * 10  # 350 W for 10 s
    parent = [s for s in second.samples if s.gpu_uuid == gpu_uuid(2)]
    # instances and the spare slice together used exactly what the GPU's counter rose by
    assert sum(s.energy_delta_mj or 0 for s in parent) == 210_000 * 10
