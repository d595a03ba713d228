"""parse_metrics against real-world dcgm-exporter payloads: one fixture per exporter quirk."""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from collectors.dcgm import EnergyTracker
from collectors.dcgm_exposition import (
    MAX_PROBLEM_LINES,
    DcgmProblem,
    ProblemKind,
    problem_dead_letter,
)
from collectors.dcgm_fields import mig_slices, owner_from_labels
from collectors.dcgm_parse import GpuActivity, ParseResult, parse_metrics
from collectors.k8s_identity import PodRules
from ledger.events import (
    GpuHealth,
    GpuSample,
    HealthKind,
    Owner,
    SampleSource,
    sample_to_dict,
)
from ledger.sample_decode import sample_from_dict

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "dcgm"
T_US = 1_793_491_200_000_000
INTERVAL_US = 30_000_000
MIB = 1 << 20


def parse(name: str, **kwargs: Any) -> ParseResult:
    options: dict[str, Any] = {
        "host_default": "fallback-host",
        "pool": "gpu-pool",
        "time_us": T_US,
        "interval_us": INTERVAL_US,
    }
    options.update(kwargs)
    return parse_metrics((FIXTURES / name).read_text(), **options)


def view(sample: GpuSample) -> dict[str, Any]:
    """The fields a case asserts, with memory in MiB and MIG and owner flattened."""
    mig = sample.mig
    owner = sample.owner
    return {
        "node": sample.node,
        "index": sample.gpu_index,
        "model": sample.model,
        "util": sample.util_gpu_pct,
        "util_mem": sample.util_mem_pct,
        "used_mib": sample.memory_used_bytes / MIB,
        "total_mib": sample.memory_total_bytes / MIB,
        "power_mw": sample.power_mw,
        "temp": sample.temperature_c,
        "clock": sample.sm_clock_mhz,
        "xid": sample.xid_errors,
        "mig": None if mig is None else (mig.profile, mig.slices, mig.total_slices),
        "owner": None if owner is None else (owner.team, owner.project, owner.job_id),
    }


def problems_of(result: ParseResult) -> set[tuple[ProblemKind, str | None, int]]:
    return {(p.kind, p.family, p.count) for p in result.problems}


@dataclass(frozen=True, slots=True)
class Case:
    fixture: str
    samples: dict[str, dict[str, Any]]  # subject → the fields of `view` the case is about
    problems: frozenset[tuple[ProblemKind, str | None, int]] = frozenset()
    xids: tuple[tuple[str, int], ...] = ()  # (GPU UUID, XID) of the health events


A100_80 = "NVIDIA A100-SXM4-80GB"
H100 = "NVIDIA H100 80GB HBM3"

CASES = [
    pytest.param(
        Case(
            "v3_hostname.txt",
            {
                "GPU-d3b6a5c2-90e1-4f0b-b7a4-2c8e9f1d0a11": {
                    "node": "gpu-node-07",
                    "index": 0,
                    "model": A100_80,
                    "util": 97,
                    "util_mem": 41,
                    "used_mib": 69632,
                    "total_mib": 81920,
                    "power_mw": 312457,
                    "temp": 54,
                    "clock": 1410,
                    "xid": 0,
                    "mig": None,
                    "owner": ("vision", None, "k8s:vision/trainer-0"),
                },
                "GPU-6e2f8a17-3c4d-4b9e-a0f1-5d7c2b8e9f22": {
                    "node": "gpu-node-07",
                    "index": 1,
                    "util": 0,
                    "util_mem": 0,
                    "used_mib": 0,
                    "total_mib": 81043,
                    "power_mw": 61230,
                    "temp": 31,
                    "clock": 210,
                    "owner": None,  # empty pod labels: no pod
                },
            },
        ),
        id="v3-Hostname-label",
    ),
    pytest.param(
        Case(
            "v4_lowercase_hostname.txt",
            {
                "GPU-0a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c01": {
                    "node": "dgx-h100-12",
                    "model": H100,
                    "util": 100,
                    "util_mem": 71,
                    "used_mib": 80535,
                    "total_mib": 81559,  # used + free; FB_RESERVED is not counted
                    "power_mw": 645998,
                    "xid": 0,
                    "owner": ("llm", None, "k8s:llm/pretrain-7b-0"),
                },
                "GPU-0a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c02": {
                    "node": "dgx-h100-12",
                    "index": 1,
                    "power_mw": 1,  # 0.0005 W: 0.5 mW rounds half up
                    "xid": 79,
                    "owner": ("llm", None, "k8s:llm/pretrain-7b-1"),
                },
            },
            xids=(("GPU-0a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c02", 79),),
        ),
        id="v4-lowercase-hostname",
    ),
    pytest.param(
        Case(
            "mig_a100.txt",
            {
                "GPU-b7c8d9e0-1f2a-4b3c-9d4e-5f6a7b8c9d01/gi1": {
                    "index": 0,
                    "util": 91,  # the slice's GR_ENGINE_ACTIVE, not the device's GPU_UTIL (88)
                    "util_mem": 30,
                    "used_mib": 30000,
                    "total_mib": 40192,
                    "power_mw": None,  # device power is never copied to slices
                    "temp": 48,
                    "clock": 1410,
                    "xid": 0,
                    "mig": ("3g.40gb", 3, 7),
                    "owner": ("vision", None, "k8s:vision/detector-5f7c9d-abcde"),
                },
                "GPU-b7c8d9e0-1f2a-4b3c-9d4e-5f6a7b8c9d01/gi5": {
                    "util": 44,
                    "util_mem": 13,  # 0.125 → 12.5 % → 13
                    "used_mib": 8000,
                    "total_mib": 19968,
                    "power_mw": None,
                    "mig": ("2g.20gb", 2, 7),
                    "owner": ("llm", None, "k8s:llm/chat-0"),
                },
                "GPU-b7c8d9e0-1f2a-4b3c-9d4e-5f6a7b8c9d01/gi9": {
                    "util": 0,
                    "used_mib": 0,
                    "total_mib": 9984,
                    "mig": ("1g.10gb", 1, 7),
                    "owner": None,
                },
                "GPU-b7c8d9e0-1f2a-4b3c-9d4e-5f6a7b8c9d01/gi13": {
                    "util": 0,  # no PROF rows for this slice
                    "util_mem": None,
                    "used_mib": 5,
                    "mig": ("1g.10gb+me", 1, 7),
                    "owner": ("media", None, "k8s:media/transcoder-0"),
                },
                "GPU-b7c8d9e0-1f2a-4b3c-9d4e-5f6a7b8c9d02": {
                    "index": 1,
                    "util": 35,
                    "util_mem": 12,
                    "used_mib": 40043,
                    "total_mib": 81043,
                    "power_mw": 180500,
                    "temp": 44,
                    "clock": 1275,
                    "mig": None,
                    "owner": None,
                },
            },
        ),
        id="mig-a100-instance-rows-only",
    ),
    pytest.param(
        Case(
            "mig_h100_h200.txt",
            {
                "GPU-e1f2a3b4-c5d6-4e7f-8a9b-0c1d2e3f4a01/gi0": {
                    "model": H100,
                    "util": 77,
                    "used_mib": 60000,
                    "total_mib": 81559,
                    "power_mw": None,
                    "temp": 60,
                    "mig": ("7g.80gb", 7, 7),
                },
                "GPU-e1f2a3b4-c5d6-4e7f-8a9b-0c1d2e3f4a02/gi11": {
                    "util": 1,
                    "used_mib": 12000,
                    "total_mib": 19968,
                    "mig": ("1g.20gb", 1, 7),
                },
                "GPU-e1f2a3b4-c5d6-4e7f-8a9b-0c1d2e3f4a02/gi12": {
                    "util": 1,  # 0.005 → 0.5 % → 1
                    "used_mib": 100,
                    "mig": ("1g.20gb", 1, 7),
                },
                "GPU-e1f2a3b4-c5d6-4e7f-8a9b-0c1d2e3f4a03/gi2": {
                    "model": "NVIDIA H200",
                    "index": 2,
                    "util": 50,
                    "used_mib": 50000,
                    "total_mib": 70100,
                    "xid": 31,
                    "mig": ("3g.71gb", 3, 7),
                },
                "GPU-e1f2a3b4-c5d6-4e7f-8a9b-0c1d2e3f4a03/gi9": {
                    "util": 99,
                    "used_mib": 17000,
                    "xid": 31,
                    "mig": ("1g.18gb", 1, 7),
                },
                # slices no instance occupies are sampled as unallocated capacity
                "GPU-e1f2a3b4-c5d6-4e7f-8a9b-0c1d2e3f4a02/gi65535": {
                    "util": 0,
                    "used_mib": 0,
                    "owner": None,
                    "mig": ("unconfigured", 5, 7),
                },
                "GPU-e1f2a3b4-c5d6-4e7f-8a9b-0c1d2e3f4a03/gi65535": {
                    "util": 0,
                    "mig": ("unconfigured", 3, 7),
                },
            },
            xids=(("GPU-e1f2a3b4-c5d6-4e7f-8a9b-0c1d2e3f4a03", 31),),  # once, not once per slice
        ),
        id="mig-h100-h200-beside-device-rows",
    ),
    pytest.param(
        Case(
            "xid_not_a_number.txt",
            {
                "GPU-a6158b59-2c1e-1e63-0068-9178c4298abd": {
                    "node": "r6i3n0",
                    "model": "Tesla V100-SXM2-32GB",
                    "util": 93,
                    "used_mib": 30300,
                    "total_mib": 32510,
                    "power_mw": 243119,
                    "temp": 57,
                    "clock": 1530,
                    "xid": None,
                },
                "GPU-8d5053b3-9280-7d1a-751b-4fd2fdd547c5": {
                    "util": 0,
                    "power_mw": 41772,
                    "clock": 135,
                    "xid": None,
                },
            },
            problems=frozenset({(ProblemKind.NOT_A_NUMBER, "DCGM_FI_DEV_XID_ERRORS", 2)}),
        ),
        id="xid-family-not-a-number",
    ),
    pytest.param(
        Case(
            "grep_no_help.txt",
            {
                "GPU-31d7c0a4-5b2e-4f9a-8e6d-1c0b9a8f7e61": {
                    "node": "inference-04",
                    "model": "NVIDIA L40S",
                    "util": 64,
                    "util_mem": None,
                    "used_mib": 41747,
                    "total_mib": 46068,
                    "power_mw": 201500,
                    "temp": 58,
                    "clock": None,
                    "owner": ("serving", None, "k8s:serving/llama-vllm-6d8f7c9b5-q4wzt"),
                },
                "GPU-31d7c0a4-5b2e-4f9a-8e6d-1c0b9a8f7e62": {
                    "util": 3,
                    "used_mib": 608,
                    "power_mw": 34005,  # 34.0045 W → 34004.5 mW → 34005, from the printed text
                    "temp": 30,
                    "owner": None,
                },
            },
        ),
        id="grep-sampled-without-help-and-type",
    ),
    pytest.param(
        Case(
            "v1_names.txt",
            {
                "GPU-8f3a1c2d-4b5e-6f70-8192-a3b4c5d6e701": {
                    "node": "fallback-host",  # 1.x has no host label
                    "model": "unknown",  # nor a model label
                    "util": 87,
                    "util_mem": 35,
                    "used_mib": 11157,
                    "total_mib": 16160,
                    "power_mw": 234567,
                    "temp": 61,
                    "clock": 1380,
                    "xid": 0,
                    "owner": ("nlp", None, "k8s:nlp/bert-train-0"),
                },
                "GPU-8f3a1c2d-4b5e-6f70-8192-a3b4c5d6e702": {
                    "util": 0,
                    "power_mw": 25001,
                    "xid": 13,
                    "owner": None,
                },
            },
            xids=(("GPU-8f3a1c2d-4b5e-6f70-8192-a3b4c5d6e702", 13),),
        ),
        id="v1-names-and-pod-labels",
    ),
    pytest.param(
        Case(
            "h100_8gpu_pods.txt",
            {
                "GPU-4a0f5c1e-7d3b-2f9a-8c61-0b9e3d7a1c01": {
                    "util": 98,
                    "owner": ("llm", None, "k8s:llm/pretrain-70b-worker-0"),
                },
                "GPU-9b2e6d40-1a7c-4e85-b3f2-6c0d8a9e2f12": {
                    "util": 97,
                    "owner": ("llm", None, "k8s:llm/pretrain-70b-worker-0"),
                },
                "GPU-c3d7a915-5e2b-8f40-a1c6-7d9b0e4f3a23": {
                    "util": 99,
                    "owner": ("llm", None, "k8s:llm/pretrain-70b-worker-0"),
                },
                "GPU-1e8f4b27-9c3d-6a51-e2b7-8f0c1d5a4b34": {
                    "util": 96,
                    "owner": ("llm", None, "k8s:llm/pretrain-70b-worker-0"),
                },
                "GPU-7f5a2c38-0d4e-9b62-f3c8-9a1d2e6b5c45": {
                    "util": 41,
                    "owner": ("vision", None, "k8s:vision/detector-7c9f8b6d54-xk2lp"),
                },
                "GPU-2c9b7d49-6e1f-0a73-c4d9-0b2e3f7c6d56": {
                    "util": 88,
                    "owner": (None, None, "slurm:48213"),
                },
                "GPU-8d0c3e5a-2f6a-1b84-d5ea-1c3f4a8d7e67": {
                    "util": 91,
                    "owner": (None, None, "slurm:48213"),
                },
                "GPU-5e1d9f6b-3a7b-2c95-e6fb-2d4a5b9e8f78": {
                    "util": 0,
                    "used_mib": 0,
                    "total_mib": 81559,
                    "power_mw": 69843,
                    "owner": None,
                },
            },
        ),
        id="one-pod-holding-four-gpus",
    ),
    pytest.param(
        Case(
            "prof_ratios.txt",
            {
                "GPU-c0ffee00-1111-4222-8333-444455556601": {
                    "util": 73,  # no GPU_UTIL: GR_ENGINE_ACTIVE 0.734210 → 73 %
                    "util_mem": 29,  # no MEM_COPY_UTIL: DRAM_ACTIVE 0.285 → 28.5 % → 29
                    "used_mib": 20480,
                    "total_mib": 40960,
                },
                "GPU-c0ffee00-1111-4222-8333-444455556602": {
                    "util": 100,
                    "util_mem": None,  # DRAM_ACTIVE 1.012 is not a ratio: dropped
                },
            },
            problems=frozenset({(ProblemKind.OUT_OF_RANGE, "DCGM_FI_PROF_DRAM_ACTIVE", 1)}),
        ),
        id="prof-ratios-despite-percent-help",
    ),
    pytest.param(
        Case(
            "bad_values.txt",
            {
                "GPU-badbad00-0000-4000-8000-000000000001": {
                    "util": 0,  # +Inf dropped
                    "power_mw": None,  # NaN dropped
                    "temp": None,  # -1 dropped
                    "used_mib": 1024,
                    "total_mib": 22528,
                },
                "GPU-badbad00-0000-4000-8000-000000000002": {
                    "util": 50,  # the first of two rows
                    "power_mw": 120250,
                    "temp": None,  # 4294967295 °C is out of range
                    "used_mib": 2048,
                    "total_mib": 2048,  # FB_FREE -Inf dropped: counts as 0
                },
            },
            problems=frozenset(
                {
                    (ProblemKind.NOT_FINITE, "DCGM_FI_DEV_GPU_UTIL", 1),
                    (ProblemKind.DUPLICATE, "DCGM_FI_DEV_GPU_UTIL", 1),
                    (ProblemKind.MISSING_UUID, "DCGM_FI_DEV_GPU_UTIL", 2),
                    (ProblemKind.NOT_FINITE, "DCGM_FI_DEV_POWER_USAGE", 1),
                    (ProblemKind.NEGATIVE, "DCGM_FI_DEV_GPU_TEMP", 1),
                    (ProblemKind.OUT_OF_RANGE, "DCGM_FI_DEV_GPU_TEMP", 1),
                    (ProblemKind.NOT_FINITE, "DCGM_FI_DEV_FB_FREE", 1),
                }
            ),
        ),
        id="nan-inf-negative-duplicate-missing-uuid",
    ),
]


@pytest.mark.parametrize("case", CASES)
def test_payload_maps_to_exact_samples(case: Case) -> None:
    result = parse(case.fixture)

    got = {s.subject: view(s) for s in result.samples}
    assert sorted(got) == sorted(case.samples)
    for subject, expected in case.samples.items():
        assert {k: got[subject][k] for k in expected} == expected, subject
    assert problems_of(result) == case.problems
    assert tuple((h.gpu_uuid, h.xid) for h in result.health) == case.xids


@pytest.mark.parametrize("case", CASES)
def test_samples_are_valid_events(case: Case) -> None:
    result = parse(case.fixture)

    assert result.samples
    for sample in result.samples:
        assert sample_from_dict(sample_to_dict(sample)) == sample
        assert sample.source is SampleSource.DCGM
        assert (sample.sample_time_us, sample.interval_us) == (T_US, INTERVAL_US)
        assert sample.pool == "gpu-pool"
        assert sample.energy_mj is None  # deltas are the collector's job
        for f in fields(GpuSample):
            assert not isinstance(getattr(sample, f.name), float), f.name


def test_the_strict_parser_rejects_what_parse_metrics_reads() -> None:
    text = (FIXTURES / "xid_not_a_number.txt").read_text()
    with pytest.raises(ValueError):
        list(text_string_to_metric_families(text))

    assert len(parse("xid_not_a_number.txt").samples) == 2


def test_mig_gpu_yields_slices_only_and_their_slices_fit_the_gpu() -> None:
    result = parse("mig_h100_h200.txt")

    by_gpu: dict[str, list[GpuSample]] = {}
    for sample in result.samples:
        by_gpu.setdefault(sample.gpu_uuid, []).append(sample)
    for samples in by_gpu.values():
        assert all(s.mig is not None for s in samples)
        assert sum(s.mig.slices for s in samples if s.mig) <= 7


def test_energy_counters_are_reported_per_physical_gpu() -> None:
    result = parse("mig_a100.txt")

    assert [(e.gpu_uuid, e.counter_mj) for e in result.energy] == [
        ("GPU-b7c8d9e0-1f2a-4b3c-9d4e-5f6a7b8c9d01", 12_345_678_901),
        ("GPU-b7c8d9e0-1f2a-4b3c-9d4e-5f6a7b8c9d02", 23_456_789_012),
    ]


def test_activity_carries_every_prof_ratio_as_percent() -> None:
    result = parse("v4_lowercase_hostname.txt")

    assert result.activity[0] == GpuActivity(
        gpu_uuid="GPU-0a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c01",
        gpu_instance_id=None,
        gr_engine_active_pct=100,
        sm_active_pct=95,
        sm_occupancy_pct=50,
        tensor_active_pct=71,  # 0.705 → 70.5 → 71: halves round up from the printed value
        dram_active_pct=70,
    )


def test_xid_health_is_emitted_only_when_the_value_changes() -> None:
    uuid = "GPU-0a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c02"

    unchanged = parse("v4_lowercase_hostname.txt", previous_xid={uuid: 79})
    changed = parse("v4_lowercase_hostname.txt", previous_xid={uuid: 13})

    assert unchanged.health == ()
    assert changed.health == (
        GpuHealth(
            node="dgx-h100-12",
            gpu_uuid=uuid,
            gpu_index=1,
            kind=HealthKind.XID_ERROR,
            detail="XID 79: GPU has fallen off the bus",
            time_us=T_US,
            source=SampleSource.DCGM,
            xid=79,
        ),
    )


def test_namespace_mapping_names_team_and_project() -> None:
    rules = PodRules(namespaces={"vision": ("computer-vision", "detection")})
    result = parse("v3_hostname.txt", pod_rules=rules)

    assert result.samples[0].owner == Owner(
        team="computer-vision", project="detection", job_id="k8s:vision/trainer-0"
    )


@pytest.mark.parametrize(
    ("labels", "owner"),
    [
        pytest.param(
            {"pod": "p", "namespace": "ns"}, Owner(team="ns", job_id="k8s:ns/p"), id="pod"
        ),
        pytest.param(
            {"pod_name": "p", "pod_namespace": "ns"}, Owner(team="ns", job_id="k8s:ns/p"), id="1.x"
        ),
        pytest.param({"pod": "p", "namespace": ""}, Owner(job_id="k8s:p"), id="no-namespace"),
        pytest.param({"hpc_job": "771"}, Owner(job_id="slurm:771"), id="hpc-job"),
        pytest.param(
            {"pod": "p", "namespace": "ns", "hpc_job": "771"},
            Owner(team="ns", job_id="k8s:ns/p"),
            id="pod-wins-over-hpc-job",
        ),
        pytest.param({"pod": "", "namespace": "", "container": ""}, None, id="empty-pod"),
        pytest.param({}, None, id="no-labels"),
    ],
)
def test_owner_from_labels(labels: dict[str, str], owner: Owner | None) -> None:
    assert owner_from_labels(labels) == owner


@pytest.mark.parametrize(
    ("profile", "model", "shares"),
    [
        pytest.param("3g.40gb", A100_80, (3, 7), id="3g.40gb"),
        pytest.param("1g.10gb", A100_80, (1, 7), id="1g.10gb"),
        pytest.param("7g.80gb", A100_80, (7, 7), id="7g.80gb"),
        pytest.param("1g.10gb+me", A100_80, (1, 7), id="1g.10gb+me"),
        pytest.param("1g.20gb", H100, (1, 7), id="h100-1g.20gb"),
        pytest.param("1g.18gb", "NVIDIA H200", (1, 7), id="h200-1g.18gb"),
        pytest.param("1c.3g.40gb", A100_80, (3, 7), id="compute-instance-prefix"),
        pytest.param("2g.12gb", "NVIDIA A30", (2, 4), id="a30-has-four-slices"),
        pytest.param("8g.90gb", A100_80, None, id="more-than-seven"),
        pytest.param("4g.24gb+me", "NVIDIA A30", (4, 4), id="a30-4g"),
        pytest.param("mig", A100_80, None, id="garbage"),
    ],
)
def test_mig_profile_shares(profile: str, model: str, shares: tuple[int, int] | None) -> None:
    assert mig_slices(profile, model) == shares


def inline(*lines: str, **kwargs: Any) -> ParseResult:
    options: dict[str, Any] = {
        "host_default": "h",
        "pool": "p",
        "time_us": T_US,
        "interval_us": INTERVAL_US,
    }
    options.update(kwargs)
    return parse_metrics("\n".join(lines), **options)


UUID = 'UUID="GPU-11111111-2222-4333-8444-555555555555"'


def test_a_line_the_parser_rejects_is_reported_and_the_rest_kept() -> None:
    result = inline(
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",{UUID}}} 42',
        f'DCGM_FI_DEV_GPU_TEMP{{gpu="0",{UUID},bad label="x"}} 50',
        f'DCGM_FI_DEV_SM_CLOCK{{gpu="0",{UUID}}} 1500 1793491200000',  # with a timestamp
    )

    assert [(s.util_gpu_pct, s.temperature_c, s.sm_clock_mhz) for s in result.samples] == [
        (42, None, 1500)
    ]
    assert problems_of(result) == {(ProblemKind.UNPARSABLE, "DCGM_FI_DEV_GPU_TEMP", 1)}


def test_bad_mig_and_index_labels_are_problems() -> None:
    result = inline(
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",{UUID},GPU_I_PROFILE="9g.90gb",GPU_I_ID="1"}} 1',
        'DCGM_FI_DEV_GPU_UTIL{gpu="x",UUID="GPU-2"} 1',
        'DCGM_FI_DEV_GPU_UTIL{device="nvidia3",UUID="GPU-3"} 7',  # index from `device`
    )

    assert [(s.gpu_uuid, s.gpu_index, s.util_gpu_pct) for s in result.samples] == [("GPU-3", 3, 7)]
    assert problems_of(result) == {(ProblemKind.BAD_LABEL, "DCGM_FI_DEV_GPU_UTIL", 2)}


def test_missing_values_and_unknown_families() -> None:
    result = inline(
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",{UUID}}}',
        f'DCGM_FI_DEV_GPU_TEMP{{gpu="0",{UUID}}} 1_000',
        f'DCGM_FI_DEV_PCIE_REPLAY_COUNTER{{gpu="0",{UUID}}} ERROR - FAILED TO CONVERT TO STRING',
        f'DCGM_FI_DEV_SM_CLOCK{{gpu="0",{UUID}}} 1410',
        "garbage ∞ line",
    )

    assert [s.sm_clock_mhz for s in result.samples] == [1410]
    assert problems_of(result) == {
        (ProblemKind.NOT_A_NUMBER, "DCGM_FI_DEV_GPU_UTIL", 1),
        (ProblemKind.NOT_A_NUMBER, "DCGM_FI_DEV_GPU_TEMP", 1),
    }


def test_a_gpu_without_one_usable_row_yields_no_sample() -> None:
    result = inline(
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",{UUID}}} NaN',
        f'DCGM_FI_DEV_POWER_USAGE{{gpu="0",{UUID}}} -3',
    )

    assert result.samples == ()
    assert {p.kind for p in result.problems} == {ProblemKind.NOT_FINITE, ProblemKind.NEGATIVE}


def test_empty_payload_is_empty() -> None:
    assert inline("") == ParseResult(samples=(), health=(), problems=())


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"pool": ""}, id="empty-pool"),
        pytest.param({"host_default": ""}, id="empty-host"),
        pytest.param({"interval_us": 0}, id="zero-interval"),
        pytest.param({"time_us": 0}, id="zero-time"),
    ],
)
def test_invalid_arguments_raise(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        inline("", **kwargs)


def test_problem_becomes_a_dead_letter_with_the_offending_lines() -> None:
    problem = parse("xid_not_a_number.txt").problems[0]

    letter = problem_dead_letter(problem)

    assert letter.reason == (
        "dcgm not_a_number DCGM_FI_DEV_XID_ERRORS: the value is not a number (2 rows)"
    )
    assert letter.payload.splitlines() == list(problem.lines)
    assert all("ERROR - FAILED TO CONVERT TO STRING" in line for line in problem.lines)


def test_problem_lines_are_capped_but_counted() -> None:
    rows = [f'DCGM_FI_DEV_GPU_UTIL{{gpu="{i}"}} 1' for i in range(MAX_PROBLEM_LINES + 10)]

    (problem,) = inline(*rows).problems

    assert problem == DcgmProblem(
        kind=ProblemKind.MISSING_UUID,
        family="DCGM_FI_DEV_GPU_UTIL",
        detail="the row has no UUID label",
        lines=tuple(rows[:MAX_PROBLEM_LINES]),
        count=MAX_PROBLEM_LINES + 10,
    )


def test_energy_tracker_deltas_resets_and_forget() -> None:
    tracker = EnergyTracker()

    assert tracker.observe("g", 1_000) is None  # first reading
    assert tracker.observe("g", 1_600) == 600
    assert tracker.observe("g", 250) == 250  # reset: counted from zero since
    tracker.forget("g")
    assert tracker.observe("g", 900) is None
    assert tracker.observe("other", 5) is None
