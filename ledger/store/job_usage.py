"""How long a samples shard keeps a job's usage so far (`job_usage`), in both stores.

A row (consumer account, job, unit) → the job's usage and reversals so far is read by the
balance outbox: a stamped shard's consumer message lists it for the jobs its commit charged
and those holding a GPU (`ledger.store.balance_outbox`); a charge adds to it, so a charge
after the row went would publish a total that starts over. Readers use a job's line only while
the global shard lists an open hold of the job (`ledger.shard_balances`: the projection
`max(0, hold − (usage so far − baseline))`); the global shard settles a hold from the union's
usage (the watermark's `ShardsSealedThrough.jobs`, summed from the postings), never from this
table, and a rebuild replays the same commits.

So a job's rows are kept until nothing can project against them any more: the job ended for
good (`ledger.job_events.ended_for_good`, folded by this shard: `StateChanges.jobs_ended`,
remembered in `ended_jobs` with the end's time, whether or not a row of the job exists yet:
its samples may come after its end), so no hold of it follows (a job that ended for good is
placed no more), and its last hold is settled: a `ShardsSealedThrough` this shard folds has
its watermark at or past the end and its `covers` leaves the job out (the global shard held no
open hold of it when the event was computed). A job still holding a GPU here is kept. Both
happen in the commits of the batches that fold them (the end with the jobs batch, the drop
with the admin batch), so a rebuild drops the same rows. A charge after the drop (a late
sample, an admin reversal) starts a row of the job again, kept; its published total is then
only the late part, which no reader projects with (no hold of the job is listed). A watermark
with no `covers` (every job) drops nothing.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import duckdb

from ledger.admin.sealed_events import ShardsSealedThrough
from ledger.assignments import Holding
from ledger.store.port import StateChanges

UsageKey = tuple[str, str, str]  # (consumer account, job, unit)


def settled_watermarks(changes: StateChanges) -> Iterator[tuple[int, frozenset[str]]]:
    """(watermark, jobs it covers) of each `ShardsSealedThrough` the batch logged (a samples
    shard logs it as changing nothing) that names the jobs it covers."""
    for entry in changes.admin:
        event = entry.envelope.data
        if isinstance(event, ShardsSealedThrough) and event.covers is not None:
            yield event.through_us, frozenset(event.covers)


def update_job_usage(con: duckdb.DuckDBPyConnection, changes: StateChanges) -> None:
    """Remember the jobs that ended, then drop the rows of those the batch's watermarks
    settle (and their `ended_jobs` rows)."""
    if changes.jobs_ended:
        jobs = sorted(changes.jobs_ended)
        con.execute(
            "INSERT INTO ended_jobs SELECT unnest(?), unnest(?) "
            "ON CONFLICT DO UPDATE SET ended_us = excluded.ended_us",
            [jobs, [changes.jobs_ended[j] for j in jobs]],
        )
    for through, covers in settled_watermarks(changes):
        settled = (
            "SELECT job_id FROM ended_jobs WHERE ended_us <= $through "
            "AND NOT list_contains($covers, job_id) AND job_id NOT IN (SELECT job_id "
            "FROM gpu_holdings WHERE to_us IS NULL AND job_id IS NOT NULL)"
        )
        values = {"through": through, "covers": sorted(covers)}
        con.execute(f"DELETE FROM job_usage WHERE job_id IN ({settled})", values)
        con.execute(f"DELETE FROM ended_jobs WHERE job_id IN ({settled})", values)


def update_memory_job_usage(
    usage: dict[UsageKey, int],
    ended: dict[str, int],
    timelines: Mapping[str, tuple[Holding, ...]],
    changes: StateChanges,
) -> None:
    """`update_job_usage` on the in-memory store's `usage` and its jobs ended `ended`."""
    ended.update(changes.jobs_ended)
    for through, covers in settled_watermarks(changes):
        holding = {
            h.owner.job_id for timeline in timelines.values() for h in timeline if h.to_us is None
        }
        settled = {j for j, t in ended.items() if t <= through} - covers - holding
        for key in [k for k in usage if k[1] in settled]:
            del usage[key]
        for job in settled:
            del ended[job]
