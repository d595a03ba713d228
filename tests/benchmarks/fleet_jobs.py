"""The generated ledgers' fleet: which job (if any) holds each GPU at each sample.

`bench_reports.generate` samples every GPU at the same instants (one sample per GPU every
`interval`); this module says whose each sample is. Real fleets are not a fresh owner per
sample: a job keeps one owner (team, project, user) for its whole life, holds one set of GPUs
and runs for minutes to weeks, so a GPU's consecutive samples belong to the same job until it
ends, and a month has tens of thousands of jobs, not a distinct job per sample. That is what
the per-job tables (the jobs rollup level) and every rollup's grouping depend on, so the
benchmark models it:

* **Jobs** are drawn (with replacement, seeded) from the Microsoft Philly trace
  (`shared/data/traces/philly_pollux.csv`, as `bench_scheduler` replays it): each draw is one
  row's run time and GPU count together — median 19 min, mean 3.6 h, up to 53 days; 93 % of
  jobs on one GPU, but jobs of 8 GPUs or more hold most GPU-hours.
* **Placement**, per pool (its 250 GPUs as nodes of 8): a job of up to 8 GPUs takes the aligned
  block of one node (1, 2, 4 or 8 GPUs) that frees first, a larger one the whole nodes that free
  first (12 and 24 GPUs round up to whole nodes); it starts an **idle gap** (exponential, mean
  `GAP_MEAN_S`) after they are all free, so a GPU idles between jobs and while a wide job waits
  for its set. With the trace's jobs this leaves about three quarters of the GPU samples owned,
  as the random shape's 75 % did.
* **Sampling**: a sample belongs to the job running on its GPU at its instant, or to none (the
  GPU's time is unallocated). At 100 M postings (a sample every 21 min) most jobs span many
  samples; a job shorter than the interval is seen by at most one sample of each of its GPUs,
  or by none — the coarse sampling misses it, as it would miss it in GPU time too.

`TALLY_BENCH_SHAPE=random` keeps the earlier worst case instead: each sample's owner and job
drawn at random (`bench_reports`' hash of the sample), about one job per sample.
"""

from __future__ import annotations

import csv
import functools
import os
from pathlib import Path

import numpy as np

TRACE = Path(__file__).resolve().parents[3] / "shared/data/traces/philly_pollux.csv"
SHAPES = ("jobs", "random")
GPUS_PER_NODE = 8
GAP_MEAN_S = 9_000  # chosen so that ~3/4 of the GPU samples are owned (see `owned_share`)
SEED = 20_260_101
SEAL_MARGIN_SAMPLES = 64  # samples per GPU past the year: `append_seal`'s seals fall there
IDLE = -1


def shape() -> str:
    """The generated ledger's shape: `jobs` (default) or `random` (`TALLY_BENCH_SHAPE`)."""
    wanted = os.environ.get("TALLY_BENCH_SHAPE", "jobs")
    if wanted not in SHAPES:
        raise ValueError(f"TALLY_BENCH_SHAPE={wanted!r}: expected one of {', '.join(SHAPES)}")
    return wanted


@functools.cache
def trace_jobs() -> tuple[np.ndarray, np.ndarray]:
    """The trace's (run seconds, GPUs) per job."""
    with TRACE.open(newline="") as handle:
        rows = [(float(r["duration"]), int(r["num_gpus"])) for r in csv.DictReader(handle)]
    seconds = np.array([max(1.0, d) for d, _ in rows], dtype=np.float64)
    gpus = np.array([w for _, w in rows], dtype=np.int64)
    return seconds, gpus


def _place_pool(
    gpus: int, horizon_s: float, rng: np.random.Generator, first_job: int
) -> tuple[list[tuple[int, int, float, float, int]], int]:
    """Jobs placed on one pool of `gpus` GPUs until every GPU is busy past `horizon_s`:
    (first GPU, GPU count, start s, end s, job number) per job placement, GPU-contiguous
    (a job of several nodes, one placement per run of adjacent nodes), and the next job number."""
    nodes = -(-gpus // GPUS_PER_NODE)
    free = np.zeros((nodes, GPUS_PER_NODE))
    free.ravel()[gpus:] = np.inf  # the last node's missing GPUs
    seconds, widths = trace_jobs()
    placed: list[tuple[int, int, float, float, int]] = []
    job = first_job
    batch = 4_096
    while True:
        picks = rng.integers(0, len(seconds), batch)
        gaps = rng.exponential(GAP_MEAN_S, batch)
        for pick, gap in zip(picks.tolist(), gaps.tolist(), strict=True):
            if free[np.isfinite(free)].min() >= horizon_s:
                return placed, job
            width = int(widths[pick])
            if width <= GPUS_PER_NODE:
                block = 1 << (width - 1).bit_length()  # 1, 2, 4 or 8
                ready = free.reshape(nodes, GPUS_PER_NODE // block, block).max(axis=2)
                node, slot = np.unravel_index(int(ready.argmin()), ready.shape)
                start = float(ready[node, slot]) + gap
                if not np.isfinite(start):
                    continue
                end = start + seconds[pick]
                lo = slot * block
                free[node, lo : lo + block] = end
                placed.append((int(node) * GPUS_PER_NODE + int(lo), block, start, end, job))
            else:
                need = min(nodes, -(-width // GPUS_PER_NODE))
                ready_nodes = free.max(axis=1)
                chosen = np.sort(np.argpartition(ready_nodes, need - 1)[:need])
                start = float(ready_nodes[chosen].max()) + gap
                if not np.isfinite(start):
                    continue
                end = start + seconds[pick]
                free[chosen] = end
                for node in chosen.tolist():
                    placed.append((node * GPUS_PER_NODE, GPUS_PER_NODE, start, end, job))
            job += 1


@functools.cache
def timeline(samples: int, interval_us: int, gpus: int, pools: int) -> np.ndarray:
    """The job number holding each GPU at each sample (`IDLE` for none), shape
    (samples + `SEAL_MARGIN_SAMPLES`, gpus): row k is the instant k × interval, column g the
    GPU `g` (pool g × pools // gpus), so the flattened array is in transaction order
    (transaction i = sample i // gpus of GPU i % gpus)."""
    rows = samples + SEAL_MARGIN_SAMPLES
    horizon_s = rows * interval_us / 1_000_000
    rng = np.random.default_rng(SEED)
    owner = np.full((rows, gpus), IDLE, dtype=np.int32)
    instants = np.arange(rows, dtype=np.float64) * (interval_us / 1_000_000)
    job = 0
    for pool in range(pools):
        first = pool * gpus // pools
        size = (pool + 1) * gpus // pools - first
        placed, job = _place_pool(size, horizon_s, rng, job)
        for lo, width, start, end, number in placed:
            a, b = np.searchsorted(instants, (start, end))
            owner[a:b, first + lo : first + lo + width] = number
    return owner


def owned_share(owner: np.ndarray) -> float:
    """The share of GPU samples some job holds."""
    return float((owner != IDLE).mean())
