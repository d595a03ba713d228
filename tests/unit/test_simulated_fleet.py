from collections import Counter

import pytest

from collectors.simulated import (
    DAY_US,
    HOUR_US,
    PoolSpec,
    SimulatedFleet,
    TeamSpec,
    WorkloadKind,
    align,
)
from tests.builders import T0_US

TEAMS = (TeamSpec("vision", ("detection",), ("ada",)), TeamSpec("search", ("ranking",)))
MIX = (
    (WorkloadKind.TRAINING, 40),
    (WorkloadKind.INFERENCE, 20),
    (WorkloadKind.NOTEBOOK, 15),
    (WorkloadKind.UNALLOCATED, 25),
)


def fleet(seed=1, nodes=4):
    return SimulatedFleet(seed, (PoolSpec("a", "A100", nodes, 8, 80),), TEAMS, MIX, 10_000_000)


def test_same_seed_same_fleet_and_samples():
    a, b = fleet(), fleet()
    assert [g.uuid for g in a.gpus] == [g.uuid for g in b.gpus]
    for t in range(3):
        assert a.sample_round(T0_US + t * 10_000_000) == b.sample_round(T0_US + t * 10_000_000)


def test_other_seed_other_fleet():
    assert fleet(1).gpus[0].uuid != fleet(2).gpus[0].uuid


def test_uuids_are_unique_and_nvidia_shaped():
    uuids = [g.uuid for g in fleet(nodes=20).gpus]
    assert len(set(uuids)) == len(uuids) == 160
    assert all(u.startswith("GPU-") and len(u) == 40 for u in uuids)


def _kinds_over_a_day(f):
    counts = Counter()
    for gpu in f.gpus:
        for hour in range(24):
            counts[f.workload_at(gpu, T0_US + hour * HOUR_US).kind] += 1
    return counts


def test_every_workload_shape_appears_roughly_in_proportion():
    counts = _kinds_over_a_day(fleet(nodes=10))
    total = sum(counts.values())
    assert set(counts) == set(WorkloadKind)
    assert 0.30 < counts[WorkloadKind.TRAINING] / total < 0.50
    assert 0.15 < counts[WorkloadKind.UNALLOCATED] / total < 0.35


@pytest.mark.parametrize(
    ("kind", "check"),
    [
        pytest.param(
            WorkloadKind.TRAINING,
            lambda s: s.util_gpu_pct >= 90 and s.memory_used_bytes >= 0.7 * s.memory_total_bytes,
            id="training-saturates",
        ),
        pytest.param(
            WorkloadKind.NOTEBOOK,
            lambda s: s.util_gpu_pct <= 1 and s.memory_used_bytes >= 0.3 * s.memory_total_bytes,
            id="notebook-holds-memory-idle",
        ),
        pytest.param(
            WorkloadKind.UNALLOCATED,
            lambda s: s.processes == () and s.util_gpu_pct == 0,
            id="unallocated-is-empty",
        ),
    ],
)
def test_workload_shapes(kind, check):
    f = fleet(nodes=10)
    seen = 0
    for gpu in f.gpus:
        t = T0_US + 10_000_000
        if f.workload_at(gpu, t - 1).kind is kind:
            assert check(f.sample(gpu, t))
            seen += 1
    assert seen > 0


def test_inference_follows_a_daily_cycle():
    only_inference = ((WorkloadKind.INFERENCE, 1),)
    f = SimulatedFleet(3, (PoolSpec("a", "A100", 1, 8, 80),), TEAMS, only_inference, 10_000_000)
    base = align(T0_US, DAY_US)
    afternoon = f.sample_round(base + int(0.6 * DAY_US))
    night = f.sample_round(base + int(0.1 * DAY_US))
    assert all(a.util_gpu_pct > n.util_gpu_pct + 20 for a, n in zip(afternoon, night, strict=True))


def test_owners_come_from_the_configured_teams():
    f = fleet(nodes=10)
    owners = {p.owner.team for s in f.sample_round(T0_US + 10_000_000) for p in s.processes}
    assert owners <= {"vision", "search"}
    assert owners


def test_energy_counter_only_grows():
    f = fleet(nodes=1)
    first = f.sample_round(T0_US + 10_000_000)
    second = f.sample_round(T0_US + 20_000_000)
    assert all(b.energy_mj > a.energy_mj for a, b in zip(first, second, strict=True))


def test_fleet_needs_teams():
    with pytest.raises(ValueError):
        SimulatedFleet(1, (PoolSpec("a", "A100", 1, 1, 80),), (), MIX, 10_000_000)
