"""A global shard's fold of the shards' watermark (`ShardsSealedThrough`,
`ledger.admin.sealed_events`), added to the commit of the admin batch that applied it. Pure:
the fold of the batch, the ledger's view and balances before it, the admin state after it in;
the same fold with what the watermark makes due added:

- every open hold that ended (released: its end is the release's time, `HoldBook.end`; or
  expired) at or before the watermark, of a job the event gives the usage of (`covers`), is
  settled once by its job's usage up to it past what the job's earlier holds settled (its
  baseline, which moves to that usage: a retried job keeps its id) and the rest released
  (`HoldBook.settle_ended`); a hold of a job it does not cover (one the global shard learned
  of after the event was computed) waits for a later watermark, which covers it;
- recurring allowances are granted through the watermark's month, every policy's, reading the
  team's spending as the global shard's own consumer postings (adjustments) plus the event's
  per-team usage: carry-over and a quarter's remainder moving on need the union's spending,
  which only the event brings. The jobs clock (`Ingestor`) grants only the policies that do not
  (`without_spending`), so a policy that spends grants a month only once every samples shard
  has sealed past its start.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import tzinfo

from ledger.accounts import AccountKind
from ledger.admin import (
    AdminView,
    BudgetPolicySet,
    Cadence,
    CarryOver,
    PeriodClosed,
    ShardsSealedThrough,
)
from ledger.balances import BalanceRow
from ledger.holds import HoldBook
from ledger.ingest.allowances import allowances_due, with_allowances
from ledger.ingest.batch import Folded, booker, sourced
from ledger.periods import period_label
from ledger.store.port import ConsumedMessage, LedgerView


def spends(policy: BudgetPolicySet) -> bool:
    """Whether the policy's grants depend on the team's spending: a carry-over rule, or a
    quarter whose remainder moves on from month to month (`ledger.admin.recurring`)."""
    return policy.carry_over is not CarryOver.NONE or policy.every is not Cadence.MONTH


def without_spending(admin: AdminView) -> AdminView:
    """`admin` less the (team, unit) budget policies any of whose policies spends: what a
    global shard grants by the jobs clock."""
    kept = {
        key: chain
        for key, chain in admin.policies.items()
        if not any(spends(p.policy) for p in chain)
    }
    return replace(admin, policies=kept)


def newest_sealed(folded: Folded) -> tuple[str, ShardsSealedThrough] | None:
    """The id and event of the `ShardsSealedThrough` the batch applied last, if any: the fold
    applies one only when its watermark is newer than every one before it, so the newest."""
    found: tuple[str, ShardsSealedThrough] | None = None
    for entry in folded.changes.admin:
        event = entry.envelope.data
        if entry.outcome == "applied" and isinstance(event, ShardsSealedThrough):
            found = (entry.envelope.id, event)
    return found


def spending_rows(sealed: ShardsSealedThrough) -> list[BalanceRow]:
    """The event's per-team usage as consumer balance rows (`budget_figures` reads them)."""
    return [
        BalanceRow(f"{AccountKind.CONSUMER}:{u.team}", u.unit.value, u.period, u.amount)
        for u in sealed.teams
    ]


def with_sealed_through(
    folded: Folded,
    sealed: ShardsSealedThrough,
    message: ConsumedMessage,
    view: LedgerView,
    admin_after: AdminView,
    balances: Iterable[BalanceRow],
    cost_centres: Mapping[str, str],
    zone: tzinfo,
) -> Folded:
    """`folded` (an admin batch's fold that applied `sealed`, from `message`) plus the hold
    settlements and allowances the watermark makes due (module docstring). `view`: the
    ledger's view before the batch (its open holds and closed periods); `admin_after`: the
    admin state after the batch; `balances`: the ledger's before it."""
    closed = view.closed | {
        e.envelope.data.period
        for e in folded.changes.admin
        if isinstance(e.envelope.data, PeriodClosed)
    }
    holds = HoldBook(view.holds, booker(closed, zone), view.baselines)
    ended = holds.settle_ended(sealed.through_us, sealed.job_usage(), sealed.covered())
    added = replace(
        folded,
        transactions=folded.transactions + tuple(sourced(ended, message)),
        changes=replace(
            folded.changes,
            holds=holds.changed(),
            baselines=holds.baselines_changed(),
            baselines_dropped=holds.baselines_dropped(),
        ),
    )
    through = period_label(sealed.through_us, zone)
    if not allowances_due(admin_after, through, zone):
        return added
    rows = [*balances, *spending_rows(sealed)]
    granted, _ = with_allowances(
        added, admin_after, through, closed, rows, cost_centres, message, zone
    )
    return granted  # more months than `MAX_MONTHS` due: the next watermark grants the rest
