"""Builders for test objects: sensible defaults, override what the test is about."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

from ledger.events import (
    Envelope,
    GpuSample,
    MigInstance,
    Owner,
    ProcessUsage,
    SampleSource,
    envelope_for,
)

T0_US = 1_793_491_200_000_000  # 2026-11-01T00:00:00Z
INTERVAL_US = 10_000_000
GIB = 1 << 30


def an_owner(
    team: str = "vision",
    project: str | None = "detection",
    user: str | None = "ada",
    job_id: str | None = "job-1",
) -> Owner:
    return Owner(team=team, project=project, user=user, job_id=job_id)


def a_process(
    pid: int = 4242, memory_gib: int = 10, sm: int | None = 50, owner: Owner | None = None
) -> ProcessUsage:
    return ProcessUsage(pid=pid, used_memory_bytes=memory_gib * GIB, sm_util_pct=sm, owner=owner)


def a_mig(profile: str = "3g.40gb", slices: int = 3, gi: int = 1) -> MigInstance:
    return MigInstance(gpu_instance_id=gi, compute_instance_id=0, profile=profile, slices=slices)


def a_sample(**overrides: Any) -> GpuSample:
    base = GpuSample(
        node="node-01",
        gpu_uuid="GPU-00000000-0000-0000-0000-000000000001",
        gpu_index=0,
        model="NVIDIA H100 80GB HBM3",
        pool="h100",
        util_gpu_pct=90,
        memory_used_bytes=40 * GIB,
        memory_total_bytes=80 * GIB,
        source=SampleSource.SIMULATED,
        sample_time_us=T0_US + INTERVAL_US,
        interval_us=INTERVAL_US,
        processes=(a_process(owner=an_owner()),),
    )
    return replace(base, **overrides)


def an_envelope(source: str = "sim://node-01", **overrides: Any) -> Envelope:
    return envelope_for(a_sample(**overrides), source)


VALID_CONFIG: dict[str, Any] = {
    "organisation": {
        "cost_centres": [
            {
                "name": "research",
                "teams": [
                    {"name": "vision", "projects": ["detection", "segmentation"]},
                    {"name": "language", "projects": ["pretraining"]},
                ],
            }
        ]
    },
    "fleet": {
        "seed": 7,
        "pools": [
            {"name": "h100", "model": "NVIDIA H100 80GB HBM3", "nodes": 1, "gpus_per_node": 4}
        ],
    },
    "prices": [{"model": "NVIDIA H100 80GB HBM3", "per_gpu_hour": "3.20"}],
}


def a_config_dict(**sections: Any) -> dict[str, Any]:
    data = copy.deepcopy(VALID_CONFIG)
    data.update(sections)
    return data
