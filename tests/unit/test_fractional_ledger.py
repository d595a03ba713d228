"""The ledger charges a MIG job exactly what it held, and a carved GPU's charges reconcile to its
physical GPU time: the collectors' accounting layout (`ledger.fractional.lay_out`), the exact
per-slice rounding (`ledger.attribution.physical_gpu_ms`), and the scheduler's `GpuAssigned`
per MIG instance read by the instance's own samples — through the real scheduling cycle and
the real ingest into DuckDB."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ledger.accounts import capacity_account, consumer_account, unallocated_account
from ledger.attribution import physical_gpu_ms
from ledger.events import MigInstance, envelope_for
from ledger.fractional import lay_out
from ledger.job_events import GpuAssigned
from ledger.store.hot import DuckDBStore
from ledger.units import Unit
from scheduler.inventory import placeable_nodes
from scheduler.model import Flavor, Policy, Quota, Team
from tests.builders import T0_US, a_sample
from tests.inventory_builders import a_record
from tests.scheduler_builders import a_cluster, a_queue, a_spec
from tests.unit.test_dcgm_properties import FIXTURES as DCGM_FIXTURES
from tests.unit.test_dcgm_properties import parse
from tests.unit.test_ingest_assignments import Ledger
from tests.unit.test_nvml_collector import collector, mixed_node

HOUR_US = 3_600 * 1_000_000
GPU = "GPU-a100-0"
POOL, MODEL = "a100", "A100"


def mig(gi: int, profile: str, slices: int, total: int = 7) -> MigInstance:
    return MigInstance(gi, 0, profile, slices, total)


LAYOUTS = {
    "two-3g-and-an-uncarved-slice": ((mig(2, "3g.40gb", 3), mig(1, "3g.40gb", 3)), (0, 3), 6),
    "fully-carved": (
        (mig(1, "4g.40gb", 4), mig(5, "2g.20gb", 2), mig(13, "1g.10gb", 1)),
        (0, 4, 6),
        None,
    ),
    "one-1g-on-a-4-slice-gpu": ((mig(3, "1g.6gb", 1, 4),), (0,), 1),
    "more-slices-than-the-gpu-has": (
        (mig(1, "4g.40gb", 4), mig(2, "4g.40gb", 4)),
        (None, None),
        None,
    ),
}


@pytest.mark.parametrize("case", LAYOUTS.values(), ids=LAYOUTS.keys())
def test_lay_out(case: tuple) -> None:
    instances, firsts, rest_first = case
    placed, rest = lay_out(instances)
    assert [m.first_slice for m in placed] == list(firsts)
    if firsts[0] is not None:  # placed in GPU-instance-id order
        assert [m.gpu_instance_id for m in placed] == sorted(m.gpu_instance_id for m in instances)
    assert (rest.first_slice if rest is not None else None) == rest_first


@pytest.mark.parametrize(
    "interval_us",
    [10_000_000, 7_000_001, 60_000_000, 1_500, 1, 999_999_999],
    ids=lambda us: f"{us}us",
)
@pytest.mark.parametrize(
    "layout", ["two-3g-and-an-uncarved-slice", "fully-carved", "one-1g-on-a-4-slice-gpu"]
)
def test_a_sampling_pass_sums_exactly_to_the_whole_gpu(interval_us: int, layout: str) -> None:
    placed, rest = lay_out(LAYOUTS[layout][0])
    parts = [*placed, *([] if rest is None else [rest])]
    whole = physical_gpu_ms(a_sample(interval_us=interval_us))
    assert sum(physical_gpu_ms(a_sample(interval_us=interval_us, mig=m)) for m in parts) == whole


def hour_of_samples(parts: list[MigInstance], interval_us: int) -> list:
    """One GPU's samples over an hour from T0, per instance, naming no owner (the scheduler's
    assignment decides who held each instance)."""
    return [
        envelope_for(
            a_sample(
                gpu_uuid=GPU,
                pool=POOL,
                model=MODEL,
                mig=m,
                processes=(),
                interval_us=interval_us,
                sample_time_us=T0_US + (k + 1) * interval_us,
            ),
            "nvml://node-01",
        )
        for k in range(HOUR_US // interval_us)
        for m in parts
    ]


def test_two_3g_jobs_and_the_idle_slice_reconcile_to_one_gpu_hour(tmp_path) -> None:
    carved = a_record(
        GPU, pool=POOL, model=MODEL, mig_mode=True, mig=(mig(1, "3g.40gb", 3), mig(2, "3g.40gb", 3))
    )
    flavor = Flavor(POOL, "A100/3g.40gb")
    teams = [Team(t, (Quota(flavor, 1),), cohort=None) for t in ("vision", "search")]
    c = a_cluster(
        teams=teams,
        queues=(a_queue(),),
        fleet=placeable_nodes([carved], T0_US, 6),
        policy=Policy(preemption=False),
    )
    c.now_us = T0_US - 1_000_000
    c.run(
        a_spec("job-v", "vision", mig_profile="3g.40gb"),
        a_spec("job-s", "search", mig_profile="3g.40gb"),
    )
    assigned = [e for e in c.log if isinstance(e, GpuAssigned)]
    assert sorted(e.gpu_uuid for e in assigned) == [f"{GPU}/gi1", f"{GPU}/gi2"]

    placed, rest = lay_out(carved.mig)
    assert rest is not None and rest.slices == 1
    interval = 60_000_000
    samples = hour_of_samples([*placed, rest], interval)
    with DuckDBStore(tmp_path / "l") as store:
        ledger = Ledger(store)
        ledger.jobs(*assigned)
        ledger.samples(*samples)
        rows = {(r.account, r.unit): r.balance for r in store.balance_rows()}

    ms = {
        team: rows[(consumer_account(team, f"{team}-project"), Unit.GPU_MS)]
        for team in ("vision", "search")
    }
    idle = rows[(unallocated_account(POOL, MODEL), Unit.GPU_MS)]
    assert ms["vision"] + ms["search"] + idle == HOUR_US // 1_000  # exactly one GPU-hour
    assert rows[(capacity_account(POOL, MODEL), Unit.GPU_MS)] == -(HOUR_US // 1_000)
    per_sample = HOUR_US // interval  # each instance is within 1 ms a sample of its exact share
    for team in ("vision", "search"):
        assert abs(ms[team] * 7 - 3 * HOUR_US // 1_000) <= 7 * per_sample
    assert abs(idle * 7 - HOUR_US // 1_000) <= 7 * per_sample
    # without the layout, each instance rounded on its own, the hour would not reconcile
    unplaced = [replace(m, first_slice=None) for m in (*placed, rest)]
    drift = sum(physical_gpu_ms(e.data) for e in hour_of_samples(unplaced, interval))
    assert drift != HOUR_US // 1_000


def test_an_instance_assignment_wins_over_its_gpus_which_covers_the_other_instances(tmp_path):
    """A whole-GPU assignment still covers the MIG samples of that GPU (as before instances were
    assigned), and an instance's own assignment wins over it."""
    placed, _ = lay_out((mig(1, "3g.40gb", 3), mig(2, "3g.40gb", 3)))
    whole = GpuAssigned(GPU, "node-01", POOL, MODEL, "job-w", "vision", "p", "u", T0_US)
    own = GpuAssigned(
        f"{GPU}/gi2", "node-01", POOL, "A100/3g.40gb", "job-s", "search", "p", "u", T0_US
    )
    with DuckDBStore(tmp_path / "l") as store:
        ledger = Ledger(store)
        ledger.jobs(whole, own)
        ledger.samples(*hour_of_samples(list(placed), HOUR_US // 6)[:2])  # the first 10 min
        gpu_ms = ledger.gpu_ms()
    assert set(gpu_ms) == {consumer_account("vision", "p"), consumer_account("search", "p")}
    expected = [physical_gpu_ms(a_sample(interval_us=HOUR_US // 6, mig=m)) for m in placed]
    assert [gpu_ms[consumer_account(t, "p")] for t in ("vision", "search")] == expected


def _passes_sum_to_whole_gpus(samples: list) -> None:
    by_gpu: dict[tuple[str, int], list] = {}
    for sample in samples:
        if sample.mig is not None:
            by_gpu.setdefault((sample.gpu_uuid, sample.sample_time_us), []).append(sample)
    assert by_gpu, "no MIG samples"
    for parts in by_gpu.values():
        assert all(s.mig.first_slice is not None for s in parts)
        whole = physical_gpu_ms(replace(parts[0], mig=None))
        assert sum(physical_gpu_ms(s) for s in parts) == whole


def test_the_nvml_collector_lays_out_each_gpus_instances() -> None:
    nvml = collector(mixed_node())  # a MIG A100 carved 3g + 2g + 1g: one slice uncarved
    _passes_sum_to_whole_gpus(list(nvml.collect_round().samples))


def test_the_dcgm_parser_lays_out_each_gpus_instances() -> None:
    text = (DCGM_FIXTURES / "mig_a100.txt").read_text()
    _passes_sum_to_whole_gpus(list(parse(text).samples))
