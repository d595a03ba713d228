"""Reading a sharded ledger's `balances` topic (`ledger.balances`), as the scheduler and the
alert watch do: each shard publishes its own balances of an account, keyed by (account, shard)
and stamped with the epoch its writer holds the shard in. `ShardBalances` keeps each shard's
newest message per account and gives its reader one message per account summed over the shards
(totals, open periods and budget lines, unit by unit), as a whole ledger's would be.

A team's budget (`budget:<team>`, with its `BudgetStatus`) is the global shard's: it holds the
grants and holds but not the usage, which the samples shards publish on the team's consumer
accounts. So the summed budget's `consumed` is the sum of the team's consumer accounts (every
shard's, adjustments included) in the budget's period, and a message that changes a team's
consumer account also gives the team's budget again (as a whole ledger re-publishes it).

A shard's message whose epoch is older than that of the message kept for the same account and
shard is ignored (a fenced writer's, or one the compacted topic kept from before a move), and so
is one of the same epoch that is not newer (`seq`) than the one kept. A message of a newer epoch
replaces the kept one whatever its `seq` (its writer numbers from its own start). Epochs are
compared per account, never per shard alone: the topic has several partitions, so an older
epoch's message for one account may arrive after the newer epoch's for another, and a new
writer republishes only the accounts its refold changes — that older message is still the
shard's newest word on its account. A refold after a move
republishes the same numbers, so the sum converges. An unstamped message (a whole ledger's)
passes through unchanged. Pure: messages in, messages out.

Open holds are projected (`ledger.hold_projection`): the global shard keeps a hold whole until
the shards' watermark passes its job's end, so the summed budget's `open_holds` is, per unit,
`Σ max(0, hold − usage so far)` over the holds its message lists, the usage so far summed over
the jobs lines of the samples shards' consumer messages (`BalanceUpdate.jobs`, each shard's
job total in that account). A job line stays until a newer message of the same account and
shard gives the job again (a message lists only the jobs its commit charged or that hold a GPU
of the shard: leaving one out changes nothing), or until the job's hold leaves every budget
(settled: nothing projects against it any more). The jobs lines come in the same message as
the consumer balance they are part of, so `consumed` and the projection move together. A job
whose usage no message read gives (a reader that started after the topic compacted away the
message that last listed it) projects its hold whole: on the safe side, until it is settled.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import replace

from ledger.accounts import AccountKind
from ledger.balances import (
    BalanceRow,
    BalanceUpdate,
    BudgetLine,
    BudgetStatus,
    JobAmount,
    account_team,
)
from ledger.hold_projection import JobUnit, projected_status


class ShardBalances:
    """The newest message per (account, shard): the highest epoch, then the highest `seq`."""

    def __init__(self) -> None:
        self._kept: dict[str, dict[str, BalanceUpdate]] = {}
        self._seq = 0  # the summed messages' own sequence: grows with every one given out
        self._jobs: dict[tuple[str, str], dict[JobUnit, int]] = {}  # (account, shard) → lines
        self._used: dict[JobUnit, int] = {}  # the jobs lines summed over accounts and shards
        self._holds: dict[tuple[str, str], frozenset[str]] = {}  # (budget, shard) → held jobs
        self._held: Counter[str] = Counter()  # job → how many budgets list a hold of it
        self._where: dict[str, set[tuple[str, str]]] = {}  # job → the keys with its lines

    def merge(self, update: BalanceUpdate) -> list[BalanceUpdate]:
        """The messages the dispatcher takes for `update`: itself when unstamped; else the
        account's message summed over the shards, and the team's budget again when it is a
        consumer account of a team with one; none when it is ignored (an older epoch, or not
        newer in its epoch)."""
        stamp = update.shard
        if stamp is None:
            return [update]
        kept = self._kept.setdefault(update.account, {})
        known = kept.get(stamp.shard)
        if known is not None and known.shard is not None:
            if stamp.epoch < known.shard.epoch:
                return []  # an older writer's word on this account
            if stamp.epoch == known.shard.epoch and update.seq <= known.seq:
                return []  # the same writer's, and not newer
        kept[stamp.shard] = update
        self._keep_holds((update.account, stamp.shard), update.budget)
        self._keep_jobs((update.account, stamp.shard), update.jobs)
        out = [self._summed(update.account)]
        team = account_team(update.account)
        budget = f"{AccountKind.BUDGET}:{team}"
        if update.account.startswith(f"{AccountKind.CONSUMER}:") and budget in self._kept:
            out.append(self._summed(budget))
        return out

    def _keep_holds(self, key: tuple[str, str], budget: BudgetStatus | None) -> None:
        """Count the jobs whose holds the budget message lists (replacing the shard's last);
        a job no budget lists a hold of any more has its jobs lines dropped."""
        jobs = frozenset(h.job_id for h in budget.holds or ()) if budget is not None else None
        for job in self._holds.pop(key, frozenset()):
            self._held[job] -= 1
            if self._held[job] <= 0:
                del self._held[job]
                if not jobs or job not in jobs:
                    self._forget(job)
        if jobs:
            self._holds[key] = jobs
            self._held.update(jobs)

    def _keep_jobs(self, key: tuple[str, str], lines: Iterable[JobAmount]) -> None:
        """The jobs lines of an (account, shard): each replaces the last of its job and unit;
        a job the message leaves out keeps its last (it charged nothing new there)."""
        kept = self._jobs.setdefault(key, {})
        for line in lines:
            job = (line.job_id, line.unit)
            self._add(job, line.amount - kept.get(job, 0))
            kept[job] = line.amount
            self._where.setdefault(line.job_id, set()).add(key)
        if not kept:
            del self._jobs[key]

    def _forget(self, job_id: str) -> None:
        """Drop the jobs lines of `job_id` (its hold is gone: nothing projects against it)."""
        for key in self._where.pop(job_id, ()):
            kept = self._jobs.get(key, {})
            for job in [j for j in kept if j[0] == job_id]:
                self._add(job, -kept.pop(job))
            if not kept:
                self._jobs.pop(key, None)

    def _add(self, job: JobUnit, amount: int) -> None:
        total = self._used.get(job, 0) + amount
        if total:
            self._used[job] = total
        else:  # as if none were known
            self._used.pop(job, None)

    def _summed(self, account: str) -> BalanceUpdate:
        kept = self._kept[account]
        self._seq += 1
        merged = summed(account, [kept[name] for name in sorted(kept)], self._seq)
        if merged.budget is None:
            return merged
        return replace(merged, budget=projected_status(self._consumed(merged.budget), self._used))

    def _consumed(self, status: BudgetStatus) -> BudgetStatus:
        """`status` with `consumed` the sum of the team's consumer accounts in its period."""
        prefix = f"{AccountKind.CONSUMER}:{status.team}/"
        used: dict[str, int] = {}
        for account, shards in self._kept.items():
            if account.startswith(prefix):
                for part in shards.values():
                    for row in part.periods:
                        if row.period == status.period:
                            used[row.unit] = used.get(row.unit, 0) + row.balance
        lines = tuple(replace(line, consumed=used.get(line.unit, 0)) for line in status.lines)
        return replace(status, lines=lines)


def summed(account: str, updates: Iterable[BalanceUpdate], seq: int) -> BalanceUpdate:
    """One unstamped message for `account`: the shards' totals and open periods summed per unit
    (and period), their budget lines summed per unit (in the latest budget period any shard
    reports), the latest current period and time."""
    parts = list(updates)
    totals: dict[str, int] = {}
    periods: dict[tuple[str, str], int] = {}
    for part in parts:
        for unit, amount in part.totals:
            totals[unit] = totals.get(unit, 0) + amount
        for row in part.periods:
            periods[(row.period, row.unit)] = periods.get((row.period, row.unit), 0) + row.balance
    currents = [p.current_period for p in parts if p.current_period is not None]
    return BalanceUpdate(
        account=account,
        seq=seq,
        as_of_us=max(p.as_of_us for p in parts),
        current_period=max(currents) if currents else None,
        periods=tuple(BalanceRow(account, u, p, b) for (p, u), b in sorted(periods.items())),
        totals=tuple(sorted(totals.items())),
        budget=_summed_budget([p.budget for p in parts if p.budget is not None]),
    )


def _summed_budget(statuses: list[BudgetStatus]) -> BudgetStatus | None:
    if not statuses:
        return None
    lines: dict[str, tuple[int, int, int]] = {}
    for status in statuses:
        for line in status.lines:
            granted, consumed, held = lines.get(line.unit, (0, 0, 0))
            lines[line.unit] = (
                granted + line.granted,
                consumed + line.consumed,
                held + line.open_holds,
            )
    listed = [s.holds for s in statuses if s.holds is not None]
    return BudgetStatus(
        statuses[0].team,
        max(s.period for s in statuses),
        tuple(BudgetLine(unit, *figures) for unit, figures in sorted(lines.items())),
        tuple(hold for holds in listed for hold in holds) if listed else None,
    )
