"""The readers' projection of a sharded ledger's open holds (`docs/design/several-workers.md`,
"Hold settlement cannot stay incremental per shard").

In a whole ledger metered usage settles a hold as it comes, so a team's open holds are
`Σ max(0, hold − usage so far)` over its jobs. A sharded ledger's global shard holds no usage:
it keeps each hold whole until the shards' watermark passes the job's end, while the samples
shards already charge the job's usage to the team's consumer accounts. A reader summing the
shards' balances would count a running job's usage twice (consumed, and still inside the whole
hold). So readers project each open hold the global shard lists (`BudgetStatus.holds`) against
its job's usage so far, summed over the samples shards' consumer messages
(`BalanceUpdate.jobs`, `ledger.shard_balances`):

    open holds of a unit = Σ over the team's open holds of max(0, hold − usage so far)

— the figure a whole ledger has after settling that usage. Never below zero per job: a job
that used more than it held frees no other job's hold (the team cannot overspend by it), and
when the watermark settles the hold (`min(usage, hold)`, the rest released) the projection of
a job that used more than its hold stays 0 throughout, while one that used less drops by the
remainder then, as a whole ledger's release does at the job's end. A hold whose job's usage no
shard has published projects whole (on the safe side). Pure: values in, values out.

A retried job keeps its id, and the shards keep usage per job id, so "usage so far" counts the
earlier attempts' too. A whole ledger counts against a hold only the usage while it is open;
so each listed hold carries its baseline (the job's usage earlier holds' settlements
accounted, `ledger.holds.OpenHold`) and projects by the usage past it:

    max(0, hold − (usage so far − baseline))

A retry placed while the earlier attempts' holds have ended but are not settled yet (the
watermark has not passed their end) joins them in one hold; `earlier` is their part. Readers
cannot tell how much of the usage past the baseline is the retry's, and a whole ledger has
released the earlier part and counts against the retry's only the retry's usage, which may be
none yet: so the retry's part projects whole, beside the earlier part projected by all that
usage,

    (hold − earlier) + max(0, earlier − (usage so far − baseline))

never less than a whole ledger's `max(0, retry's hold − retry's usage)` (the team never looks
richer than one worker's ledger shows; it may look poorer, by the retry's usage, until the
watermark settles the earlier part and the retry's hold projects on its own).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from ledger.balances import BudgetStatus, JobAmount

JobUnit = tuple[str, str]  # (job id, unit)


def projected_hold(hold: JobAmount, usage: int | None) -> int:
    """One open hold projected against its job's usage so far (module docstring); None: no
    usage of the job known (none published, or a reader forgot the job's lines while no hold
    of it was listed): the hold whole, whatever its baseline."""
    if usage is None:
        return hold.amount
    used = usage - hold.baseline
    if hold.earlier:
        return hold.amount - hold.earlier + max(0, hold.earlier - used)
    return max(0, hold.amount - used)


def projected_holds(holds: Iterable[JobAmount], usage: Mapping[JobUnit, int]) -> dict[str, int]:
    """Per unit, the sum of `projected_hold` over `holds` (open holds per job; a job named
    twice in a unit is one hold of their sum, from the larger baseline); `usage`: the jobs'
    usage so far per (job, unit), absent: none known."""
    held: dict[JobUnit, JobAmount] = {}
    for hold in holds:
        key = (hold.job_id, hold.unit)
        before = held.get(key)
        held[key] = (
            hold
            if before is None
            else JobAmount(
                hold.job_id,
                hold.unit,
                before.amount + hold.amount,
                max(before.baseline, hold.baseline),
                before.earlier + hold.earlier,
            )
        )
    out: dict[str, int] = {}
    for key, hold in held.items():
        out[hold.unit] = out.get(hold.unit, 0) + projected_hold(hold, usage.get(key))
    return out


def projected_status(status: BudgetStatus, usage: Mapping[JobUnit, int]) -> BudgetStatus:
    """`status` with each line's open holds projected (`projected_holds`) when it lists its
    holds; unchanged when it does not (a whole ledger's, whose holds are settled already)."""
    if status.holds is None:
        return status
    projected = projected_holds(status.holds, usage)
    lines = tuple(replace(line, open_holds=projected.get(line.unit, 0)) for line in status.lines)
    return replace(status, lines=lines)
