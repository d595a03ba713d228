"""What a shard keeps of a fold: the roles an `Ingestor` writes in, and `kept_by`, the pure
projection of one route's `Folded` onto what a shard of a role commits
(`docs/design/several-workers.md`, "What a shard keeps of a fold").

- `WHOLE`: one ledger of everything (today's worker): the fold as it is.
- `SAMPLES`: one `samples` partition's shard. It folds admin and jobs for their views (prices,
  teams, closed periods, budgets, job owners, GPU assignments) and keeps of them only what its
  own usage needs: the usage corrections a late owner or a late assignment causes (reversal and
  re-posting, with their owner, awaiting, resolved and timeline changes) and admin reversals of
  its own usage transactions. Grants, adjustments, holds (placed, released, settled, expired,
  and the open-hold projection), the audit trail, alerts, cordons and the admin/jobs dead
  letters are the global shard's. Its samples route is kept as folded: it holds no open holds,
  so its usage settles and expires none. It takes no inventory reports (`ShardRoleError`).
- `GLOBAL`: the admin, jobs and inventory topics: everything of them (grants, adjustments,
  holds, allowances, audit, the admin log, inventory, their dead letters). Its admin fold
  treats a reversal whose target it does not hold as another shard's (logged, not refused:
  `ledger.ingest.admin`, `targets_elsewhere`). It takes no samples (`ShardRoleError`).

Recurring allowances are the global shard's: with no samples, its clock is the newest new hold
or assignment event of a jobs batch (`Ingestor`, the same rule as `ledger.ingest.allowances`)
for policies that do not depend on spending; a grant that does (carry-over, a quarter's
remainder moving on) needs the union's usage, which reaches the global shard as the shards'
watermark, a `ShardsSealedThrough` on the admin topic (`ledger.admin.sealed_events`): such a
policy grants a month when the watermark enters it, reading the event's per-team usage
(`ledger.ingest.sealed`).

Every shard folds admin and jobs in the same batch order, so the union of the shards' postings
is the whole ledger's, except the hold accounts' periods: the global shard holds no usage, so
it settles a hold once, when the hold has ended (released: its end is the release's time; or
expired) and a `ShardsSealedThrough` past its end is folded, by `min(the job's usage up to the
watermark, the hold)`, and releases the rest (`HoldBook.end`, `HoldBook.settle_ended`) — the
amounts the whole ledger settles and releases batch by batch, booked at the hold's end rather
than with each usage. An admin reversal that no shard can post (its target unknown, already
reversed, or not applied yet when the reversal is folded) is a dead letter of the whole ledger
but of no shard (the global shard logs it as another shard's, and a samples shard drops its
admin letters): `verify` reports it from the global shard's admin log
(`ledger.store.union_verify`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from enum import StrEnum

from ledger.ingest.batch import Folded
from ledger.postings import TransactionKind
from ledger.store.port import SourcedTransaction, StateChanges


class ShardRole(StrEnum):
    """What part of the ledger an `Ingestor` writes."""

    WHOLE = "whole"
    SAMPLES = "samples"
    GLOBAL = "global"


class Route(StrEnum):
    """The Ingestor's routes: which topic a batch's messages came from."""

    ADMIN = "admin"
    JOBS = "jobs"
    INVENTORY = "inventory"
    SAMPLES = "samples"


class ShardRoleError(ValueError):
    """A batch holds messages a shard of this role does not take (a wiring error: the worker
    consumed a topic its shard is not for). Raised before anything is committed."""


_REFUSED = {
    (ShardRole.SAMPLES, Route.INVENTORY): "a samples shard takes no inventory reports "
    "(the global shard folds them)",
    (ShardRole.GLOBAL, Route.SAMPLES): "the global shard takes no samples "
    "(each samples partition's shard folds its own)",
}
_USAGE_KINDS = frozenset({TransactionKind.USAGE, TransactionKind.REVERSAL})


def refusal(role: ShardRole, route: Route) -> str | None:
    """Why a shard of `role` takes no messages of `route`, or None when it takes them."""
    return _REFUSED.get((role, route))


def kept_by(role: ShardRole, route: Route, folded: Folded) -> Folded:
    """What a shard of `role` commits of one route's fold (`folded.dead` includes the route's
    undecodable messages); raises `ShardRoleError` for a route the role takes no messages of.
    `derived_from` is recounted over what is kept."""
    problem = refusal(role, route)
    if problem is not None:
        raise ShardRoleError(problem)
    if role is not ShardRole.SAMPLES or route is Route.SAMPLES:
        return folded
    if route is Route.JOBS:
        return _samples_of_jobs(folded)
    return _samples_of_admin(folded)


def _samples_of_jobs(folded: Folded) -> Folded:
    """A jobs fold in a samples shard: the corrections of its usage (reversals and re-postings)
    and the views (owners, timelines, awaiting, resolved, events seen); no holds, audit or
    dead letters."""
    kept = _keep(folded, lambda t: t.txn.kind in _USAGE_KINDS)
    dropped = replace(kept.changes, holds=(), baselines={}, baselines_dropped=(), audit=())
    return replace(kept, dead=(), changes=dropped)


def _samples_of_admin(folded: Folded) -> Folded:
    """An admin fold in a samples shard: the admin log (the views: prices, teams, closes,
    budgets, policies) and the reversals of transactions it holds; not the batch's own grants
    and adjustments (the global shard's), nor reversals of them, audit, cordons, alerts or dead
    letters."""
    targets = dict(folded.changes.reversals)  # target → reversal
    reversing = {reversal: target for target, reversal in targets.items()}
    dropped: set[str] = set()
    kept_ids: set[str] = set()
    for item in folded.transactions:  # in order: a target comes before its reversal
        txn = item.txn
        target = reversing.get(txn.txn_id)
        if txn.kind is TransactionKind.REVERSAL and target is not None and target not in dropped:
            kept_ids.add(txn.txn_id)
        else:
            dropped.add(txn.txn_id)
    kept = _keep(folded, lambda t: t.txn.txn_id in kept_ids)
    changes = StateChanges(
        admin=folded.changes.admin,
        reversals=[(t, r) for t, r in folded.changes.reversals if r in kept_ids],
    )
    return replace(kept, dead=(), changes=changes, fleet_alerts=())


def _keep(folded: Folded, keep: Callable[[SourcedTransaction], bool]) -> Folded:
    """`folded` with only the transactions `keep` says, `derived_from` recounted."""
    kept: list[SourcedTransaction] = []
    derived_from = 0
    for index, item in enumerate(folded.transactions):
        if keep(item):
            kept.append(item)
            if index < folded.derived_from:
                derived_from += 1
    return replace(folded, transactions=tuple(kept), derived_from=derived_from)
