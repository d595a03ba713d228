"""The benchmarks' fleet of jobs (`tests.benchmarks.fleet_jobs`) and the segments written from
it: a job holds one set of GPUs in one pool for one unbroken run, keeps one owner in the
postings, and about three quarters of the GPU samples are owned."""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pytest

from tests.benchmarks import fleet_jobs
from tests.benchmarks.bench_reports import GPUS, POOLS, write_segment

HOUR_US = 3_600_000_000
SAMPLES = 24 * 10  # ten days of hourly samples


@pytest.fixture(scope="module")
def owner() -> np.ndarray:
    return fleet_jobs.timeline(SAMPLES, HOUR_US, GPUS, len(POOLS))


def test_a_job_holds_one_gpu_set_in_one_pool_for_one_unbroken_run(owner: np.ndarray) -> None:
    rows, gpus = owner.shape
    assert (rows, gpus) == (SAMPLES + fleet_jobs.SEAL_MARGIN_SAMPLES, GPUS)
    jobs = np.unique(owner[owner != fleet_jobs.IDLE])
    assert len(jobs) > 1_000
    pool_of = np.arange(gpus) * len(POOLS) // gpus
    for job in jobs[:: max(1, len(jobs) // 300)].tolist():
        held = owner == job
        samples = np.flatnonzero(held.any(axis=1))
        assert samples[-1] - samples[0] + 1 == len(samples), f"job {job} stops and restarts"
        gpu_sets = {tuple(np.flatnonzero(held[k]).tolist()) for k in samples.tolist()}
        assert len(gpu_sets) == 1, f"job {job} changes GPUs"
        (gpu_set,) = gpu_sets
        assert len({int(pool_of[g]) for g in gpu_set}) == 1, f"job {job} spans pools"


def test_most_gpu_samples_are_owned_and_gpus_idle_between_jobs(owner: np.ndarray) -> None:
    settled = owner[SAMPLES // 3 : SAMPLES]  # once the empty fleet has filled
    assert 0.6 < fleet_jobs.owned_share(settled) < 0.9
    changes = (settled[1:] != settled[:-1]).sum()
    assert changes < settled.size / 10, "a GPU's consecutive samples mostly share a job"


@pytest.mark.parametrize("shape", ["jobs", "random"], ids=["jobs-shape", "random-shape"])
def test_a_segment_gives_each_job_one_owner_in_the_jobs_shape(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, owner: np.ndarray, shape: str
) -> None:
    monkeypatch.setenv("TALLY_BENCH_SHAPE", shape)
    path = tmp_path / "segment.parquet"
    lo, hi = 5 * 24 * GPUS, 6 * 24 * GPUS  # day 5
    con = duckdb.connect(":memory:")
    try:
        write_segment(con, lo, hi, SAMPLES, HOUR_US, path)  # the fixture's timeline
        owners_per_job, jobs, owned = con.execute(
            "SELECT max(n), count(*), sum(samples) FROM (SELECT job_id, "
            'count(DISTINCT (team, project, "user")) AS n, count(*) // 2 AS samples '
            f"FROM read_parquet('{path}') WHERE job_id IS NOT NULL GROUP BY job_id)"
        ).fetchone() or (None, None, None)
    finally:
        con.close()
    assert owned is not None and 0.6 < owned / (hi - lo) < 0.9
    if shape == "jobs":
        assert owners_per_job == 1
        assert jobs < owned / 5, "a job spans many samples"
    else:
        assert owners_per_job > 1, "the worst case draws a sample's owner at random"
