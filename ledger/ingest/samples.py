"""The samples route's fold: GPU samples into usage transactions, idle-detector steps and hold
settlements, as a pure function of the batch, the ledger's view and the rules.

A sample that names no owner goes to whoever the GPU's assignment timeline says held it over
the sample's interval (split by time when the holder changed), else to unallocated capacity;
an unpriced model is a dead letter. A sample whose natural period is closed is booked into the
next open one. Each GPU subject's idle detector is stepped in sample-time order and flags
confirmed-idle usage. Usage settles the open holds of its jobs; holds whose expiry the batch's
newest new event has passed are released (a duplicate moves no clock).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from ledger.assignments import Holding, OwnedPiece, owners_over
from ledger.attribution import Usage, attribute_usage
from ledger.closing import booking_period
from ledger.errors import PricingError
from ledger.events import DeadLetter, SampleEnvelope
from ledger.holds import HoldBook
from ledger.idle import GpuIdleState, IdleAlert, IdleObservation, step
from ledger.ingest.batch import Folded, FoldRules, booker, refused, sourced
from ledger.ingest.validation import check_transaction
from ledger.store.port import (
    ConsumedMessage,
    LedgerView,
    SourcedTransaction,
    StateChanges,
    ViewKeys,
)

DecodedSample = tuple[SampleEnvelope, ConsumedMessage]


def sample_keys(decoded: Sequence[DecodedSample]) -> ViewKeys:
    """What the samples fold reads of the ledger for these samples."""
    return ViewKeys(
        event_ids=[e.id for e, _ in decoded],
        gpu_uuids=frozenset(e.data.gpu_uuid for e, _ in decoded),
        subjects=frozenset(e.subject for e, _ in decoded),
        holds=True,
    )


def fold_samples(decoded: Sequence[DecodedSample], view: LedgerView, rules: FoldRules) -> Folded:
    seen = set(view.seen)
    dead: list[DeadLetter] = []
    transactions: list[SourcedTransaction] = []
    usages: list[tuple[SampleEnvelope, int, Usage]] = []
    duplicates = 0
    newest: int | None = None  # of the events new to the ledger: a duplicate moves nothing
    for envelope, message in decoded:
        if envelope.id in seen:
            duplicates += 1
            continue
        seen.add(envelope.id)
        newest = envelope.time_us if newest is None else max(newest, envelope.time_us)
        held = held_over(view.timelines.get(envelope.data.gpu_uuid), envelope)
        try:
            usage = attribute_usage(envelope, rules.prices, rules.cost_centres, held)
        except PricingError as exc:
            dead.append(refused(str(exc), envelope.id, message))
            continue
        txn = usage.txn
        if txn.period in view.closed:  # late usage: a flagged prior-period posting
            txn = replace(txn, period=booking_period(txn.period, view.closed))
        problem = check_transaction(txn, view.closed)
        if problem is not None:
            dead.append(refused(problem, envelope.id, message))
            continue
        usages.append((envelope, len(transactions), usage))
        transactions.extend(sourced([txn], message))
    states, alerts = detect_idle(usages, transactions, view.idle, rules)
    holds = HoldBook(view.holds, booker(view.closed))
    derived = len(transactions)
    for settlement in holds.settle([t.txn for t in transactions]):
        source = transactions[settlement.last_usage]
        transactions.append(replace(source, txn=settlement.txn))
    if newest is not None:
        transactions.extend(sourced(holds.expire(newest), decoded[-1][1]))
    return Folded(
        transactions=tuple(transactions),
        dead=tuple(dead),
        changes=StateChanges(holds=holds.changed()),
        idle_states=tuple(states),
        alerts=tuple(alerts),
        duplicates=duplicates,
        derived_from=derived,
    )


def detect_idle(
    usages: list[tuple[SampleEnvelope, int, Usage]],
    transactions: list[SourcedTransaction],
    stored: Mapping[str, GpuIdleState],
    rules: FoldRules,
) -> tuple[list[GpuIdleState], list[IdleAlert]]:
    """Step each GPU subject's idle detector in sample-time order, flagging confirmed-idle
    usage in `transactions` (in place). A GPU the scheduler assigned is allocated even when
    its sample names no owner (`Usage.owner` is then the holder)."""
    if not usages:
        return [], []
    usages = sorted(usages, key=lambda item: (item[0].subject, item[0].time_us))
    states: dict[str, GpuIdleState] = {}
    alerts: list[IdleAlert] = []
    for envelope, index, usage in usages:
        sample = envelope.data
        obs = IdleObservation(
            subject=envelope.subject,
            gpu_uuid=sample.gpu_uuid,
            node=sample.node,
            pool=sample.pool,
            model=sample.model,
            owner=usage.owner,
            util_pct=sample.util_gpu_pct,
            start_us=sample.start_us,
            end_us=sample.sample_time_us,
            gpu_ms=usage.gpu_ms,
            cost_micros=usage.cost_micros,
        )
        before = states.get(envelope.subject) or stored.get(envelope.subject)
        state, raised, flag = step(before, obs, rules.idle_policy)
        states[envelope.subject] = state
        alerts.extend(raised)
        if flag:
            item = transactions[index]
            transactions[index] = replace(item, txn=replace(item.txn, idle=True))
    return list(states.values()), alerts


def held_over(timeline: tuple[Holding, ...] | None, envelope: SampleEnvelope) -> list[OwnedPiece]:
    """Who the scheduler says held the sample's GPU over its interval; empty when nobody."""
    if not timeline:
        return []
    sample = envelope.data
    pieces = owners_over(timeline, sample.start_us, sample.sample_time_us)
    return pieces if any(p.owner is not None for p in pieces) else []
