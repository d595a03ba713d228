"""The admin route's fold: budget grants, adjustments and reversals into transactions, GPU
cordons into the inventory records they change, and every applied admin event (prices, teams,
quotas, closes, cordons) into the admin log, in offset order. Pure:
the batch, the ledger's view and the configured cost centres.

An event whose recorded `role` may not make it (`ledger.roles`) is refused as a dead letter
naming the role and the action; an event without a role is the local operator's and applies.

A budget policy is recorded in the log (the samples route grants from it,
`ledger.ingest.allowances`); an allowance record sent on the topic is refused. A grant into a
closed period, a stale grant (its `expected_total` is not the ledger's), a
reversal of an unknown, unreversible or already reversed transaction are refused as dead
letters. A period closed by the batch takes nothing afterwards: later entries of the batch are
booked into the next open period.

Requests (`ledger.admin.requests`): each step is checked against the request projection (open,
not expired by the step's time, an approver the request names, never the requester), recorded,
audited and raised as an alert; an approval's effect — the `BudgetGranted` or `QuotaSet` the
change needs, with a content-derived id — is applied right after it like any admin event, so
it happens once, and a rebuild makes it again with the same id. A decision step refused on a
request the ledger knows (not open, expired, a wrong approver, its change refused) is a dead
letter and also logged with the outcome `refused: <reason>` and alerted (`tally.request.refused`),
so readers and the scheduler's desk show the request `refused` with the ledger's reason.

A global shard (`ledger.ingest.shards`) folds with `targets_elsewhere`: a reversal whose target
the ledger does not hold may be a samples shard's usage (that shard posts it), so it is logged
with the outcome `ELSEWHERE_OUTCOME` and audited, not refused; and with `global_shard`: a
`ShardsSealedThrough` (made by the ledger only: one recording a role is refused) is applied when
its watermark is newer than the newest folded (`ledger.ingest.sealed` then settles the holds
that ended and grants the allowances it makes due); any other ledger logs it as
`SEALED_ELSEWHERE`, changing nothing.

Every event applied (not one that changed nothing) is also an audit entry
(`ledger.ingest.audit`) with the value it replaced: the previous price, team definition, quota,
granted total, or the period still open.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, tzinfo

from ledger.admin import (
    ACTION_OF,
    REVERSIBLE,
    AdjustmentRecorded,
    AdminEnvelope,
    AppliedAdmin,
    BudgetAllowanceGranted,
    BudgetGranted,
    GpuCordoned,
    GpuUncordoned,
    PeriodClosed,
    PriceSet,
    QuotaSet,
    ShardsSealedThrough,
    TeamDefined,
    adjustment_transaction,
    grant_transaction,
    reversal_transaction,
)
from ledger.admin.request_events import REQUEST_CLASSES, RequestOpened
from ledger.admin.requests import (
    REFUSED_OUTCOME,
    RequestState,
    fold_request,
    refusal_alert,
    refused_step,
    request_alert,
    request_states,
)
from ledger.admin.view import ELSEWHERE_OUTCOME
from ledger.audit import AuditEntry
from ledger.closing import booking_period
from ledger.events import DeadLetter
from ledger.fleet_alerts import FleetAlert
from ledger.ingest.audit import (
    adjustment_state,
    admin_entry,
    close_states,
    grant_states,
    price_state,
    quota_state,
    team_state,
)
from ledger.ingest.batch import Folded, refused
from ledger.ingest.validation import check_transaction
from ledger.inventory import InventoryGpu, cordon_records
from ledger.postings import Transaction
from ledger.roles import admin_event_refusal
from ledger.store.port import (
    ConsumedMessage,
    LedgerView,
    SourcedTransaction,
    StateChanges,
    ViewKeys,
)

DecodedAdmin = tuple[AdminEnvelope, ConsumedMessage]


def admin_keys(decoded: Sequence[DecodedAdmin]) -> ViewKeys:
    """What the admin fold reads of the ledger for these events."""
    events = [e.data for e, _ in decoded]
    return ViewKeys(
        admin_ids=[e.id for e, _ in decoded],
        txn_ids=frozenset(
            e.reverses_txn
            for e in events
            if isinstance(e, AdjustmentRecorded) and e.reverses_txn is not None
        ),
        admin=True,
        inventory=any(isinstance(e, GpuCordoned | GpuUncordoned) for e in events),
        holds=any(isinstance(e, ShardsSealedThrough) for e in events),  # a global shard settles
    )


SEALED_ELSEWHERE = "unchanged: only a global shard folds the shards' watermark"
SEALED_NOT_NEWER = "unchanged: not newer than the watermark folded"


def role_refusal(envelope: AdminEnvelope) -> str | None:
    """Why the role the event records may not make it (`ledger.roles`), or None."""
    action = ACTION_OF.get(envelope.data.KIND)
    if action is None:  # an allowance record: refused by the fold whatever its role
        return None
    return admin_event_refusal(action, envelope.data.role)


def closes_a_period(decoded: Sequence[DecodedAdmin], view: LedgerView) -> bool:
    """Whether the batch closes a period not closed yet (the store is sealed first then, so the
    close's checksum sees every posting of the period)."""
    return any(
        isinstance(e.data, PeriodClosed)
        and e.data.period not in view.closed
        and e.id not in view.admin_applied
        for e, _ in decoded
    )


def fold_admin(
    decoded: Sequence[DecodedAdmin],
    view: LedgerView,
    cost_centres: Mapping[str, str],
    zone: tzinfo = UTC,
    *,
    targets_elsewhere: bool = False,
    global_shard: bool = False,
) -> Folded:
    """`zone`: the ledger's time zone, whose months grants and adjustments fall in.
    `targets_elsewhere`: a reversal of a transaction this ledger does not hold is another
    shard's to post (logged, not refused); `global_shard`: a `ShardsSealedThrough` is applied
    (a global shard's fold, `ledger.ingest.shards`), not only logged."""
    fold = _AdminFold(view, cost_centres, zone, targets_elsewhere, global_shard)
    applied = set(view.admin_applied)
    dead: list[DeadLetter] = []
    duplicates = 0
    for envelope, message in decoded:
        if envelope.id in applied:
            duplicates += 1
            continue
        applied.add(envelope.id)
        problem = role_refusal(envelope) or fold.apply(envelope, message)
        if problem is not None:
            dead.append(refused(problem, envelope.id, message))
    return Folded(
        transactions=tuple(fold.transactions),
        dead=tuple(dead),
        changes=StateChanges(
            admin=fold.entries,
            reversals=fold.reversals,
            audit=fold.audit,
            inventory=fold.inventory_changes(),
        ),
        duplicates=duplicates,
        derived_from=len(fold.transactions),
        fleet_alerts=tuple(fold.alerts),
    )


class _AdminFold:
    """The admin events of one batch, folded in order into transactions and log entries."""

    def __init__(
        self,
        view: LedgerView,
        cost_centres: Mapping[str, str],
        zone: tzinfo,
        targets_elsewhere: bool = False,
        global_shard: bool = False,
    ):
        self.view = view
        self.zone = zone
        self.targets_elsewhere = targets_elsewhere
        self.global_shard = global_shard
        self.sealed = view.admin.sealed
        self.closed = set(view.closed)
        self.centres = dict(cost_centres) | {
            team: t.cost_centre for team, t in view.admin.teams.items()
        }
        self.teams = dict(view.admin.teams)
        self.quotas = dict(view.admin.quotas)
        self.prices: dict[tuple[str, str | None], PriceSet] = {}
        for price in view.admin.prices:
            self._price_in_force(price)
        # One-off grants are checked against the one-off total (allowances are not in it).
        self.totals = dict(view.admin.budgets)
        self.pending: dict[str, Transaction] = {}
        self.reversed: set[str] = set()
        self.transactions: list[SourcedTransaction] = []
        self.entries: list[AppliedAdmin] = []
        self.reversals: list[tuple[str, str]] = []
        self.audit: list[AuditEntry] = []
        self.inventory = dict(view.inventory)
        self.requests: dict[str, RequestState] = dict(view.admin.requests)
        self.alerts: list[FleetAlert] = []

    def _price_in_force(self, price: PriceSet) -> None:
        """Keep the latest effective price per (model, pool), as `AdminView.latest_price`."""
        key = (price.model, price.pool)
        known = self.prices.get(key)
        if known is None or price.effective_us >= known.effective_us:
            self.prices[key] = price

    def inventory_changes(self) -> dict[str, InventoryGpu]:
        return {u: g for u, g in self.inventory.items() if g != self.view.inventory.get(u)}

    def apply(self, envelope: AdminEnvelope, message: ConsumedMessage) -> str | None:
        """Fold one event; the reason it is refused, or None."""
        event = envelope.data
        outcome = "applied"
        txn: Transaction | None = None
        before: dict[str, object] | None = None
        after: dict[str, object] | None = None
        if isinstance(event, BudgetGranted):
            if event.period in self.closed:
                return f"budget for {event.period} refused: the period is closed"
            key = (event.team, event.period, event.unit)
            total = self.totals.get(key, 0)
            if event.expected_total is not None and event.expected_total != total:
                return (
                    f"stale grant: computed against a total of {event.expected_total} "
                    f"{event.unit}, the ledger has {total}"
                )
            txn = grant_transaction(envelope, self.centres.get(event.team), self.zone)
            problem = check_transaction(txn, self.closed)
            if problem is not None:
                return problem
            self.totals[key] = total + event.amount
            before, after = grant_states(event, total)
        elif isinstance(event, BudgetAllowanceGranted):
            return "allowance records are made by the ledger from budget policies, not sent"
        elif isinstance(event, ShardsSealedThrough):
            if event.role is not None:
                return "a shards' watermark is made by the ledger, not by a role"
            known = self.sealed.through_us if self.sealed is not None else None
            if not self.global_shard:
                outcome = SEALED_ELSEWHERE
            elif known is not None and event.through_us <= known:
                outcome = SEALED_NOT_NEWER
            else:
                self.sealed = event
                before = None if known is None else {"through_us": known}
                after = {"through_us": event.through_us}
        elif isinstance(event, REQUEST_CLASSES):
            return self._request(envelope, message)
        elif isinstance(event, AdjustmentRecorded) and event.reverses_txn is not None:
            result = self._reversal(envelope, event.reverses_txn)
            if isinstance(result, str):
                return result
            if result is None:  # another shard's transaction: that shard posts the reversal
                outcome = ELSEWHERE_OUTCOME
                after = {"reverses_txn": event.reverses_txn}
            else:
                txn = result
                after = {"reverses_txn": event.reverses_txn, "booked_period": txn.period}
        elif isinstance(event, AdjustmentRecorded):
            assert event.period is not None
            period = booking_period(event.period, self.closed)
            txn = adjustment_transaction(envelope, period, self.centres, self.zone)
            problem = check_transaction(txn, self.closed)
            if problem is not None:
                return problem
            after = adjustment_state(event, period)
        elif isinstance(event, PeriodClosed):
            if event.period in self.closed:
                outcome = "unchanged: already closed"
            self.closed.add(event.period)
            before, after = close_states(event)
        elif isinstance(event, TeamDefined):
            team = self.teams.get(event.team)
            if team is not None and team.definition == event.definition:
                outcome = "unchanged"
            self.teams[event.team] = event
            self.centres[event.team] = event.cost_centre
            before, after = team_state(team), team_state(event)
        elif isinstance(event, GpuCordoned | GpuUncordoned):
            cordon = (event.actor, event.reason) if isinstance(event, GpuCordoned) else None
            changed = cordon_records(self.inventory, event.target, cordon)
            if not changed:
                outcome = "unchanged: no GPU of the inventory changed"
            self.inventory.update(changed)
        elif isinstance(event, QuotaSet):
            quota = self.quotas.get((event.team, event.pool, event.model))
            if quota is not None and quota.limits == event.limits:
                outcome = "unchanged"
            self.quotas[(event.team, event.pool, event.model)] = event
            before, after = quota_state(quota), quota_state(event)
        elif isinstance(event, PriceSet):
            before, after = (
                price_state(self.prices.get((event.model, event.pool))),
                price_state(event),
            )
            self._price_in_force(event)
        self.entries.append(AppliedAdmin(envelope, outcome))
        if outcome in ("applied", ELSEWHERE_OUTCOME):
            self.audit.append(admin_entry(envelope, before, after))
        if txn is not None:
            self.pending[txn.txn_id] = txn
            self.transactions.append(
                SourcedTransaction(txn, message.topic, message.partition, message.offset)
            )
        return None

    def _request(self, envelope: AdminEnvelope, message: ConsumedMessage) -> str | None:
        """A request step: recorded, audited and alerted; an approval's effect (the grant or
        quota it makes, `ledger.admin.requests.effect`) applied right after it as an admin
        event of its own. An approval whose effect is refused is refused with it."""
        event = envelope.data
        assert isinstance(event, REQUEST_CLASSES)
        states = dict(self.requests)
        made, problem = fold_request(states, event)
        if problem is not None:
            return self._refused(envelope, problem)
        state = states[event.request_id]
        at, audit_at = len(self.entries), len(self.audit)
        if made is not None:
            problem = self.apply(made, message)
            if problem is not None:
                reason = f"request {event.request_id}: its change is refused: {problem}"
                return self._refused(envelope, reason)
        self.requests = states
        if isinstance(event, RequestOpened):
            before, after = request_states(event)
        else:
            before = {"status": "open"}
            after = {"status": state.status.value, "effect": state.effect}
        self.entries.insert(at, AppliedAdmin(envelope))
        self.audit.insert(audit_at, admin_entry(envelope, before, after))
        self.alerts.append(request_alert(event, state))
        return None

    def _refused(self, envelope: AdminEnvelope, reason: str) -> str:
        """A decision step the ledger refuses (a dead letter, `reason`) on a request it knows:
        logged with the outcome `refused: <reason>` (so the request projection shows it, and
        a resent copy is a duplicate) and alerted (`tally.request.refused`), so the scheduler's
        desk, which saw the step on the topic, learns the ledger's answer. The request stays
        as it was."""
        event = envelope.data
        assert isinstance(event, REQUEST_CLASSES)
        states = dict(self.requests)
        state = refused_step(states, event, reason)
        if state is not None:
            self.requests = states
            self.entries.append(AppliedAdmin(envelope, REFUSED_OUTCOME + reason))
            self.alerts.append(refusal_alert(event, state, envelope.id))
        return reason

    def _reversal(self, envelope: AdminEnvelope, target: str) -> Transaction | str | None:
        """The reversal of `target`, or why it is refused; None when the ledger does not hold
        `target` and it may be another shard's (`targets_elsewhere`)."""
        original = self.pending.get(target) or self.view.transactions.get(target)
        if original is None:
            return None if self.targets_elsewhere else f"no transaction {target} to reverse"
        if original.kind not in REVERSIBLE:
            return f"a {original.kind} transaction is not reversed by hand"
        if target in self.reversed or target in self.view.reversed_by:
            return f"transaction {target} is already reversed"
        period = booking_period(original.period, self.closed)
        txn = reversal_transaction(envelope, original, period)
        problem = check_transaction(txn, self.closed)
        if problem is not None:
            return problem
        self.reversed.add(target)
        self.reversals.append((target, envelope.id))
        return txn
