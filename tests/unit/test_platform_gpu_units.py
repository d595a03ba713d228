"""The Platform page's fleet now (`ledger.read.rollups.fleet_now`) counts each GPU once, whatever
holds parts of it: busy when any holder is busy, allocated-but-idle when every holder is idle,
unallocated when nobody holds any of it — so busy + allocated-but-idle + unallocated is the
GPUs reporting — and a share (or MIG slice) idle beside a busy one is an idle share, listed
with its owner, its GPU counted busy. One real ledger (DuckDB, sealed) of six minutes of
samples, fed through the real ingest with the share idle detector; a GPU per named case."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pytest

from ledger.events import envelope_for
from ledger.fractional import share_key
from ledger.idle import MINUTE_US
from ledger.job_events import GpuAssigned
from ledger.read import rollups
from ledger.read.reports import ReportQueries
from ledger.store.hot import DuckDBStore
from tests.builders import T0_US, a_mig, a_process, a_sample, an_owner
from tests.unit.test_share_idle import MODEL, POOL, Feed, minute

BUSY, IDLE, FREE = (
    rollups.GpuState.BUSY,
    rollups.GpuState.ALLOCATED_IDLE,
    rollups.GpuState.UNALLOCATED,
)
MINUTES = 6  # past the 3-minute grace: idle holders are flagged in the newest sample


@dataclass(frozen=True)
class Case:
    shares: tuple[tuple[str, int], ...]  # job, per-mille of the GPU, held from T0
    sm: dict[str, int]  # job → its process's SM % in every minute (no job: no process)
    gpu: rollups.GpuState  # the GPU, counted once
    listed: tuple[tuple[rollups.GpuState, str | None, bool], ...]  # its idle rows: job, part
    mig: dict[int, tuple[str, int]] | None = None  # MIG instance → (job, SM %) instead


CASES = {
    "whole-gpu-busy": Case((), {"w": 80}, BUSY, ()),
    "whole-gpu-idle": Case((), {"w": 0}, IDLE, ((IDLE, "w", False),)),
    "nobody-holds-it": Case((), {}, FREE, ((FREE, None, False),)),
    "two-shares-busy": Case((("a", 500), ("b", 500)), {"a": 60, "b": 30}, BUSY, ()),
    "one-share-idle-beside-a-busy-one": Case(
        (("a", 500), ("b", 250)), {"a": 0, "b": 80}, BUSY, ((IDLE, "a", True),)
    ),
    "every-share-idle": Case(
        (("a", 500), ("b", 500)), {"a": 0}, IDLE, ((IDLE, "a", False), (IDLE, "b", False))
    ),
    "a-busy-share-and-the-rest-unallocated": Case((("a", 250),), {"a": 70}, BUSY, ()),
    "an-idle-share-and-the-rest-unallocated": Case(
        (("a", 250),), {"a": 0}, IDLE, ((IDLE, "a", False),)
    ),
    "a-mig-slice-idle-beside-a-busy-one": Case(
        (), {}, BUSY, ((IDLE, "m2", True),), mig={1: ("m1", 80), 2: ("m2", 0)}
    ),
}
GPUS = {name: f"GPU-{n:08d}-0000-0000-0000-000000000000" for n, name in enumerate(CASES)}


def _share(gpu: str, job: str, share: int) -> GpuAssigned:
    key = share_key(gpu, job)
    return GpuAssigned(key, "node-01", POOL, MODEL, job, "vision", "p", "u", T0_US, share=share)


def _mig_minute(m: int, gpu: str, gi: int, job: str, sm: int):
    sample = a_sample(
        gpu_uuid=gpu,
        sample_time_us=T0_US + (m + 1) * MINUTE_US,
        interval_us=MINUTE_US,
        util_gpu_pct=sm,
        processes=(a_process(pid=100 + gi, sm=sm, owner=an_owner("vision", "p", "u", job)),),
        mig=a_mig(profile="3g.40gb", slices=3, gi=gi),
    )
    return envelope_for(sample, "sim://node-01")


@pytest.fixture(scope="module")
def now(tmp_path_factory: pytest.TempPathFactory) -> rollups.FleetNow:
    path = tmp_path_factory.mktemp("platform") / "ledger"
    with DuckDBStore(path) as store:
        feed = Feed(store)
        feed.jobs(*(_share(GPUS[n], job, per) for n, c in CASES.items() for job, per in c.shares))
        envelopes = []  # one batch: the fold steps the detectors sample by sample
        for m in range(MINUTES):
            for name, case in CASES.items():
                if case.mig is None:
                    envelopes.append(minute(m, case.sm, gpu=GPUS[name]))
                else:
                    for gi, (job, sm) in case.mig.items():
                        envelopes.append(_mig_minute(m, GPUS[name], gi, job, sm))
        feed.samples(*envelopes)
        store.seal()
    q = ReportQueries(path)
    try:
        return rollups.fleet_now(q)
    finally:
        q.close()


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_a_gpu_is_one_unit_and_its_idle_holders_are_listed(now, case):
    gpu = GPUS[next(n for n, c in CASES.items() if c is case)]
    listed = sorted((g.state, g.job_id, g.part_of_busy_gpu) for g in now.idle if g.gpu_uuid == gpu)
    assert listed == sorted(case.listed, key=lambda r: (r[0], r[1] or ""))


def test_the_fleet_adds_up_to_the_gpus_reporting(now):
    states = Counter(case.gpu for case in CASES.values())
    assert now.gpus == len(CASES)
    assert (now.busy, now.count(IDLE), now.count(FREE)) == (
        states[BUSY],
        states[IDLE],
        states[FREE],
    )
    assert now.busy + now.allocated_idle + now.unallocated == now.gpus
    parts = sum(1 for c in CASES.values() for _, _, part in c.listed if part)
    assert now.idle_shares == parts == 2
