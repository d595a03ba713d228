"""Benchmark: the NVML collector's own cost per sampling round, against naive polling.

A node of 8 GPUs × 16 processes on the fake NVML with realistic per-call latencies
(`fake_nvml.REALISTIC_LATENCY_S`, paid in sleeps, so they cost wall time and no CPU). Owners are
resolved from a fake /proc tree on disk (environ, cgroup, status per process).

- collector: `NvmlCollector` with `OwnerResolver` — handles and static facts cached, one
  process-utilisation call per GPU with the previous round's timestamp, owners cached per process;
- baseline, naive polling: every round re-fetches the device count, handles, UUID and name,
  asks process utilisation once per process (window average, then searches for its pid), and
  resolves every process's owner again.

Figures: CPU ms per round (time.process_time), wall ms per round, NVML calls per round.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pynvml

from collectors.fake_nvml import REALISTIC_LATENCY_S, FakeNvml, busy_node
from collectors.nvml import NvmlCollector
from collectors.ownership import OwnerResolver
from ledger.events import GpuSample, ProcessUsage, SampleSource
from tests.benchmarks.harness import Figure, Progress

BENCH = "nvml"
GPUS = 8
PROCESSES = 16
ROUNDS = 25
T0 = 1_793_491_200_000_000
STEP_US = 10_000_000


def fake_proc(root: Path, fake: FakeNvml) -> None:
    """One /proc/<pid> per fake process: a Slurm job in its environment and cgroup, a uid."""
    for gpu in fake.gpus:
        for proc in gpu.processes:
            base = root / str(proc.pid)
            base.mkdir(parents=True)
            job = proc.pid // 4
            env = f"PATH=/usr/bin\0HOME=/home/u\0SLURM_JOB_ID={job}\0SLURM_JOB_USER=ada\0" * 20
            (base / "environ").write_bytes(env.encode())
            (base / "cgroup").write_text(
                f"0::/system.slice/slurmstepd.scope/job_{job}/step_0/user/task_0\n"
            )
            (base / "status").write_text("Name:\tpython\nUid:\t1000\t1000\t1000\t1000\n")


def naive_round(nvml: FakeNvml, resolver: OwnerResolver, now: int) -> list[GpuSample]:
    """What a first NVML poller does: everything asked again, per process where possible."""
    samples = []
    for index in range(nvml.nvmlDeviceGetCount()):
        h = nvml.nvmlDeviceGetHandleByIndex(index)
        uuid = nvml.nvmlDeviceGetUUID(h)
        name = nvml.nvmlDeviceGetName(h)
        memory = nvml.nvmlDeviceGetMemoryInfo(h)
        rates = nvml.nvmlDeviceGetUtilizationRates(h)
        power = nvml.nvmlDeviceGetPowerUsage(h)
        energy = nvml.nvmlDeviceGetTotalEnergyConsumption(h)
        temperature = nvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
        clock = nvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)
        nvml.nvmlDeviceGetMigMode(h)
        processes = []
        for p in nvml.nvmlDeviceGetComputeRunningProcesses(h):
            try:
                utils = nvml.nvmlDeviceGetProcessUtilization(h, 0)
            except pynvml.NVMLError_NotFound:
                utils = []
            sm = next((int(s.smUtil) for s in utils if s.pid == p.pid), None)
            processes.append(ProcessUsage(p.pid, p.usedGpuMemory or 0, sm, resolver(p.pid, uuid)))
        samples.append(
            GpuSample(
                node="bench",
                gpu_uuid=uuid,
                gpu_index=index,
                model=name,
                pool="bench",
                util_gpu_pct=rates.gpu,
                memory_used_bytes=memory.used,
                memory_total_bytes=memory.total,
                source=SampleSource.NVML,
                sample_time_us=now,
                interval_us=STEP_US,
                util_mem_pct=rates.memory,
                power_mw=power,
                energy_mj=energy,
                processes=tuple(processes),
                temperature_c=temperature,
                sm_clock_mhz=clock,
            )
        )
    return samples


def measure(fake: FakeNvml, one_round: Callable[[int], object]) -> tuple[float, float, float]:
    """Median CPU ms, median wall ms and mean NVML calls of a warm round."""
    one_round(T0)  # warm: start, static facts, first owners
    fake.settle()
    cpu, wall = [], []
    calls_before = sum(fake.calls.values())
    for r in range(1, ROUNDS + 1):
        fake.tick(10)
        c0, w0 = time.process_time(), time.perf_counter()
        one_round(T0 + r * STEP_US)
        fake.settle()
        cpu.append((time.process_time() - c0) * 1000)
        wall.append((time.perf_counter() - w0) * 1000)
    calls = (sum(fake.calls.values()) - calls_before) / ROUNDS
    return statistics.median(cpu), statistics.median(wall), calls


def run(progress: Progress) -> list[Figure]:
    with tempfile.TemporaryDirectory(prefix="tally-bench-proc-") as tmp:
        root = Path(tmp)

        progress(f"collector: {GPUS} GPUs × {PROCESSES} processes, {ROUNDS} rounds")
        fake = busy_node(GPUS, PROCESSES, latency_s=REALISTIC_LATENCY_S)
        fake_proc(root, fake)
        clock_now = [T0]
        collector = NvmlCollector(
            fake,
            "bench",
            "bench",
            clock=lambda: clock_now[0],
            owner_resolver=OwnerResolver(root),
        )

        def collector_round(now: int) -> object:
            clock_now[0] = now
            result = collector.collect_round()
            assert len(result.samples) == GPUS
            return result

        cpu, wall, calls = measure(fake, collector_round)
        collector.close()

        progress("baseline: naive polling")
        naive_fake = busy_node(GPUS, PROCESSES, latency_s=REALISTIC_LATENCY_S)
        naive_fake.nvmlInit()
        resolver = OwnerResolver(root)
        naive_cpu, naive_wall, naive_calls = measure(
            naive_fake, lambda now: naive_round(naive_fake, resolver, now)
        )

    note = f"{GPUS} GPUs × {PROCESSES} processes, median of {ROUNDS} warm rounds"
    return [
        Figure(
            BENCH,
            "CPU per round",
            cpu,
            "ms",
            "naive polling",
            naive_cpu,
            higher_is_better=False,
            target="< 10 ms",
            note=note,
        ),
        Figure(
            BENCH,
            "wall per round",
            wall,
            "ms",
            "naive polling",
            naive_wall,
            higher_is_better=False,
            note="NVML latencies assumed (REALISTIC_LATENCY_S), paid in sleeps",
        ),
        Figure(
            BENCH,
            "NVML calls per round",
            calls,
            "calls",
            "naive polling",
            naive_calls,
            higher_is_better=False,
        ),
    ]
