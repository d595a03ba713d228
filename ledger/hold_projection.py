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
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from ledger.balances import BudgetStatus, JobAmount

JobUnit = tuple[str, str]  # (job id, unit)


def projected_holds(holds: Iterable[JobAmount], usage: Mapping[JobUnit, int]) -> dict[str, int]:
    """Per unit, `Σ max(0, hold − usage so far)` over `holds` (open holds per job; a job
    named twice in a unit is one hold of their sum); `usage`: the jobs' usage so far per
    (job, unit), absent: none known."""
    held: dict[JobUnit, int] = {}
    for hold in holds:
        key = (hold.job_id, hold.unit)
        held[key] = held.get(key, 0) + hold.amount
    out: dict[str, int] = {}
    for (job, unit), amount in held.items():
        out[unit] = out.get(unit, 0) + max(0, amount - usage.get((job, unit), 0))
    return out


def projected_status(status: BudgetStatus, usage: Mapping[JobUnit, int]) -> BudgetStatus:
    """`status` with each line's open holds projected (`projected_holds`) when it lists its
    holds; unchanged when it does not (a whole ledger's, whose holds are settled already)."""
    if status.holds is None:
        return status
    projected = projected_holds(status.holds, usage)
    lines = tuple(replace(line, open_holds=projected.get(line.unit, 0)) for line in status.lines)
    return replace(status, lines=lines)
