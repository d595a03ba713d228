"""The jobs route's fold: the scheduler's holds (placed, released, expired) into hold
transactions, and its GPU assignments (`GpuAssigned` / `GpuReleased`) into each GPU's timeline
(`ledger.assignments`); job submissions and cancellations become audit entries
(`ledger.ingest.audit`), each event once however often it is delivered; the topic's other job
events are passed over. An event not seen before
whose time is before its job's (holds) or GPU's (assignments) dedupe cutoff is a dead letter
(`ledger.dedupe`: too late to deduplicate). Pure: the batch, the ledger's view and nothing
else."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, tzinfo

from ledger.assignments import HOLDING_MEMORY_US, Holding, assign, forget_before, release
from ledger.audit import AuditEntry
from ledger.dedupe import assignment_scope, job_scope, too_late
from ledger.events import DeadLetter, Owner
from ledger.holds import HoldBook, HoldEnvelope, HoldPlaced, decode_jobs_message
from ledger.ingest.audit import job_entry
from ledger.ingest.batch import Folded, booker, located, refused, sourced
from ledger.ingest.validation import check_transaction
from ledger.job_events import GpuAssigned, GpuReleased, JobEnvelope
from ledger.store.port import (
    ConsumedMessage,
    LedgerView,
    SourcedTransaction,
    StateChanges,
    ViewKeys,
)


class DecodedJobs:
    """A jobs batch decoded: holds and assignments, each with its message, and dead letters."""

    def __init__(self, messages: Sequence[ConsumedMessage]) -> None:
        self.holds: list[tuple[HoldEnvelope, ConsumedMessage]] = []
        self.assignments: list[tuple[JobEnvelope, ConsumedMessage]] = []
        self.audited: list[AuditEntry] = []
        self.dead: list[DeadLetter] = []
        for message in messages:
            read = decode_jobs_message(message.value)
            self.dead.extend(located(letter, message) for letter in read.dead)
            self.holds.extend((envelope, message) for envelope in read.holds)
            self.assignments.extend((envelope, message) for envelope in read.assignments)
            self.audited.extend(e for a in read.audited if (e := job_entry(a)) is not None)

    @property
    def count(self) -> int:
        return len(self.holds) + len(self.assignments)

    def keys(self) -> ViewKeys:
        gpus = frozenset(e.subject for e, _ in self.assignments)
        return ViewKeys(
            event_ids=[e.id for e, _ in self.holds] + [e.id for e, _ in self.assignments],
            gpu_uuids=gpus,
            scopes=frozenset(job_scope(e.data.job_id) for e, _ in self.holds)
            | {assignment_scope(g) for g in gpus},
            holds=True,
            audit_ids=[e.event_id for e in self.audited],
        )


def fold_jobs(
    batch: DecodedJobs,
    view: LedgerView,
    last: ConsumedMessage | None = None,
    zone: tzinfo = UTC,
) -> Folded:
    """`last`: the message the batch's expiries are sourced to (its last message); `zone`: the
    ledger's time zone, whose months hold settlements and expiries are booked into."""
    seen = set(view.seen)
    cutoffs = view.forgotten_before
    holds = HoldBook(view.holds, booker(view.closed, zone))
    dead: list[DeadLetter] = []
    transactions: list[SourcedTransaction] = []
    without_postings: list[tuple[str, int, str]] = []
    duplicates = 0
    newest: int | None = None  # of the events new to the ledger: a duplicate moves nothing
    for envelope, message in batch.holds:
        if envelope.id in seen:
            duplicates += 1
            continue
        scope = job_scope(envelope.data.job_id)
        late = too_late(envelope.time_us, scope, cutoffs.get(scope))
        if late is not None:
            dead.append(refused(late, envelope.id, message))
            continue
        seen.add(envelope.id)
        newest = envelope.time_us if newest is None else max(newest, envelope.time_us)
        if isinstance(envelope.data, HoldPlaced):
            mark = holds.checkpoint()
            placed = holds.place(envelope)
            if isinstance(placed, str):
                dead.append(refused(placed, envelope.id, message))
                continue
            problem = check_transaction(placed, view.closed)
            if problem is not None:  # a refused placement holds nothing
                holds.restore(mark)
                dead.append(refused(problem, envelope.id, message))
                continue
            transactions.extend(sourced([placed], message))
            continue
        mark = holds.checkpoint()
        released = holds.release(envelope)
        if released is None:
            without_postings.append((envelope.id, envelope.time_us, scope))
            continue
        problem = check_transaction(released, view.closed)
        if problem is not None:  # a refused release leaves the holds open
            holds.restore(mark)
            dead.append(refused(problem, envelope.id, message))
            continue
        transactions.extend(sourced([released], message))
    timelines: dict[str, tuple[Holding, ...]] = {}
    for change, message in batch.assignments:
        if change.id in seen:
            duplicates += 1
            continue
        gpu = change.subject
        scope = assignment_scope(gpu)
        late = too_late(change.time_us, scope, cutoffs.get(scope))
        if late is not None:
            dead.append(refused(late, change.id, message))
            continue
        seen.add(change.id)
        newest = change.time_us if newest is None else max(newest, change.time_us)
        without_postings.append((change.id, change.time_us, scope))
        timelines[gpu] = fold_assignment(timelines.get(gpu, view.timelines.get(gpu, ())), change)
    audit: list[AuditEntry] = []
    audited = set(view.audited)
    for entry in batch.audited:
        if entry.event_id not in audited:
            audited.add(entry.event_id)
            audit.append(entry)
    derived = len(transactions)
    if newest is not None and last is not None:
        transactions.extend(sourced(holds.expire(newest), last))
    return Folded(
        transactions=tuple(transactions),
        dead=tuple(dead),
        changes=StateChanges(
            holds=holds.changed(), seen=without_postings, timelines=timelines, audit=audit
        ),
        duplicates=duplicates,
        derived_from=derived,
    )


def fold_assignment(timeline: tuple[Holding, ...], envelope: JobEnvelope) -> tuple[Holding, ...]:
    """A GPU's timeline after one `GpuAssigned` or `GpuReleased`."""
    event = envelope.data
    if isinstance(event, GpuAssigned):
        owner = Owner(event.team, event.project, event.user, event.job_id)
        timeline = assign(timeline, Holding(event.gpu_uuid, owner, event.time_us))
    elif isinstance(event, GpuReleased):
        timeline = release(timeline, event.job_id, event.time_us)
    return forget_before(timeline, envelope.time_us - HOLDING_MEMORY_US)
