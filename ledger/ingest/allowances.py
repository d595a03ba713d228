"""The grants recurring budgets make, added to a samples batch's commit: GPU samples are the
ledger's clock, so the first batch holding a sample new to the ledger (a resent one changes
nothing) in a month grants every budget policy's allowance and carry-over due up to that month
(`ledger.admin.recurring` holds the rules).

In a sharded ledger (`ledger.ingest.shards`) the global shard grants instead, from the first
jobs batch holding a hold or assignment event new to it in a month (it folds no samples); a
samples shard grants nothing. A policy whose grants need the team's spending (carry-over, a
quarter's remainder) grants there only from the shards' watermark, reading the union's spending
from the `ShardsSealedThrough` event (`ledger.ingest.sealed`).

Pure: the fold of the batch, the month it reaches, the admin state, the ledger's balances before
the batch and the cost centres in; the same fold with the grant transactions (derived, so
validated before the commit) and their allowance records (admin-log entries) added.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import replace
from datetime import tzinfo

from ledger.admin import (
    AdminView,
    AppliedAdmin,
    admin_envelope,
    allowance_transaction,
    budget_figures,
    plan_allowances,
)
from ledger.admin.events import LEDGER_BUDGETS_SOURCE
from ledger.admin.recurring import MAX_MONTHS
from ledger.balances import BalanceRow
from ledger.ingest.batch import Folded
from ledger.store.port import ConsumedMessage, SourcedTransaction


def allowances_due(admin: AdminView, through: str, zone: tzinfo) -> bool:
    """Whether some policy may grant a month up to `through` (cheap: no balances read);
    `zone` is the ledger's time zone."""
    for key, chain in admin.policies.items():
        latest = admin.latest_allowance.get(key)
        if latest is None:
            if min(p.first(zone) for p in chain) <= through:
                return True
        elif latest.period < through:
            return True
    return False


def with_allowances(
    folded: Folded,
    admin: AdminView,
    through: str,
    closed: Collection[str],
    balances: Iterable[BalanceRow],
    cost_centres: Mapping[str, str],
    message: ConsumedMessage,
    zone: tzinfo,
) -> tuple[Folded, bool]:
    """`folded` plus the allowances due up to month `through`, and whether that is all of them
    (False when some (team, unit) reached `MAX_MONTHS`: the next batch grants more). The grants
    carry the source coordinates of `message` (the batch's last); months are
    those of `zone`, the ledger's time zone."""
    granted, consumed = budget_figures(balances)
    records = plan_allowances(
        admin.policies, admin.latest_allowance, through, closed, granted, consumed, zone
    )
    per_key = Counter((r.team, r.unit) for r in records)
    complete = all(count < MAX_MONTHS for count in per_key.values())
    if not records:
        return folded, complete
    entries: list[AppliedAdmin] = []
    grants: list[SourcedTransaction] = []
    for record in records:
        envelope = admin_envelope(record, LEDGER_BUDGETS_SOURCE)
        entries.append(AppliedAdmin(envelope))
        txn = allowance_transaction(envelope, cost_centres.get(record.team), zone)
        if txn is not None:
            grants.append(SourcedTransaction(txn, message.topic, message.partition, message.offset))
    added = replace(
        folded,
        transactions=folded.transactions + tuple(grants),
        changes=replace(folded.changes, admin=(*folded.changes.admin, *entries)),
    )
    return added, complete
