"""The jobs route's fold: the scheduler's holds (placed, released, expired) into hold transactions,
and its GPU assignments (`GpuAssigned` / `GpuReleased`) into each GPU's timeline
(`ledger.assignments`); job submissions and cancellations become audit entries
(`ledger.ingest.audit`), each event once however often it is delivered. Submissions, assignments
and starts make job owners known (`ledger.job_owners`); each suspense transaction awaiting a job
made known here is corrected: reversed and re-posted to its owner (a re-posting that still
awaits another job awaits it in turn); unallocated usage of a GPU booked before the
`GpuAssigned` covering it is corrected the same way, to whoever the new timeline says held the
GPU (an assignment wins over a job-only owner, as in attribution — but usage naming a job the
batch makes known, by its assignment too, is corrected to that job first); usage a timeline had
split among its holders is split again when the batch changes that timeline before the usage's
end (a `GpuReleased` folded after the sample spanning it: `by_timeline`). A correction settles
its jobs' open holds by what it adds to their usage (`gained`). The topic's other job events
are passed over. An event not seen before whose time is before its job's (holds) or GPU's
(assignments) dedupe cutoff is a dead letter
(`ledger.dedupe`: too late to deduplicate). Pure: the batch, the ledger's view and nothing else."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, tzinfo

from ledger.accounts import AccountKind
from ledger.admin.sealed_events import ShardsSealedThrough
from ledger.assignments import (
    HOLDING_MEMORY_US,
    Holding,
    assign,
    forget_before,
    owners_over,
    release,
    shares_over,
)
from ledger.audit import AuditEntry
from ledger.closing import booking_period
from ledger.dedupe import assignment_scope, job_scope, too_late
from ledger.events import DeadLetter, Owner
from ledger.fractional import share_parent
from ledger.holds import HoldBook, HoldEnvelope, HoldPlaced
from ledger.ingest.audit import job_entry
from ledger.ingest.batch import Folded, booker, located, refused, sourced
from ledger.ingest.validation import check_transaction
from ledger.job_events import (
    GpuAssigned,
    GpuReleased,
    JobEnvelope,
    JobStarted,
    JobSubmitted,
    ended_for_good,
)
from ledger.job_owners import (
    awaited_by,
    correction,
    gpu_key,
    held_key,
    learned_owners,
    reassigned,
    retimed,
)
from ledger.jobs_message import decode_jobs_message
from ledger.postings import Posting, Transaction
from ledger.store.port import (
    ConsumedMessage,
    LedgerView,
    SourcedTransaction,
    StateChanges,
    ViewKeys,
)
from ledger.units import Unit

_CONSUMER = f"{AccountKind.CONSUMER}:"


class DecodedJobs:
    """A jobs batch decoded: holds and assignments, each with its message, and dead letters."""

    def __init__(self, messages: Sequence[ConsumedMessage]) -> None:
        self.holds: list[tuple[HoldEnvelope, ConsumedMessage]] = []
        self.assignments: list[tuple[JobEnvelope, ConsumedMessage]] = []
        self.audited: list[AuditEntry] = []
        self.identities: list[tuple[JobEnvelope, ConsumedMessage]] = []  # name job owners
        self.ended: dict[str, int] = {}  # jobs ended for good → when (`ended_for_good`)
        self.dead: list[DeadLetter] = []
        for message in messages:
            read = decode_jobs_message(message.value)
            self.dead.extend(located(letter, message) for letter in read.dead)
            self.holds.extend((envelope, message) for envelope in read.holds)
            self.assignments.extend((envelope, message) for envelope in read.assignments)
            self.audited.extend(e for a in read.audited if (e := job_entry(a)) is not None)
            self.ended.update(ended_for_good(read.audited))
            self.identities.extend(
                (e, message)
                for e in (*read.audited, *read.assignments)
                if isinstance(e.data, JobSubmitted | JobStarted | GpuAssigned)
            )

    @property
    def count(self) -> int:
        return len(self.holds) + len(self.assignments)

    def keys(self) -> ViewKeys:
        gpus = frozenset(e.subject for e, _ in self.assignments)
        shared = {g for e, _ in self.assignments if (g := share_parent(e.subject)) is not None}
        return ViewKeys(
            event_ids=[e.id for e, _ in self.holds] + [e.id for e, _ in self.assignments],
            gpu_uuids=gpus | shared,
            scopes=frozenset(job_scope(e.data.job_id) for e, _ in self.holds)
            | {assignment_scope(g) for g in gpus},
            holds=True,
            hold_jobs=frozenset(
                e.data.job_id for e, _ in self.holds if isinstance(e.data, HoldPlaced)
            )
            | self.ended.keys(),
            audit_ids=[e.event_id for e in self.audited],
            job_keys=frozenset(k for e, _ in self.identities for k in _job_keys(e))
            | {gpu_key(e.subject) for e, _ in self.assignments if isinstance(e.data, GpuAssigned)}
            | {gpu_key(g) for g in shared}
            | {held_key(g) for g in gpus | shared},
        )


def _job_keys(envelope: JobEnvelope) -> tuple[str, ...]:
    """The job keys an identity event names: its job, and the executor's id of the run."""
    event = envelope.data
    if isinstance(event, JobStarted) and event.executor_id:
        return (event.job_id, event.executor_id)
    return (event.job_id,) if isinstance(event, JobSubmitted | GpuAssigned) else ()


def fold_jobs(
    batch: DecodedJobs,
    view: LedgerView,
    last: ConsumedMessage | None = None,
    zone: tzinfo = UTC,
    cost_centres: Mapping[str, str] | None = None,
    sealed: ShardsSealedThrough | None = None,
    *,
    settle_at_end: bool = False,
) -> Folded:
    """`last`: the message the batch's expiries are sourced to (its last message); `zone`: the
    ledger's time zone, whose months hold settlements and expiries are booked into;
    `cost_centres`: those of the teams whose usage a correction re-posts. `settle_at_end`: a
    global shard's fold (`ledger.ingest.shards`): a release ends the job's holds instead of
    releasing them, nothing expires by the jobs' clock, and the holds ended at or before the
    watermark of `sealed` (the newest `ShardsSealedThrough` folded) are settled from its usage
    and released (`HoldBook.settle_ended`)."""
    seen = set(view.seen)
    cutoffs = view.forgotten_before
    holds = HoldBook(view.holds, booker(view.closed, zone), view.baselines)
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
        if settle_at_end:
            holds.end(envelope)
            without_postings.append((envelope.id, envelope.time_us, scope))
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
    assigned: dict[str, tuple[JobEnvelope, ConsumedMessage]] = {}  # the last per GPU
    changed: dict[str, Change] = {}  # per timeline: its first change's time, its last change
    for change, message in batch.assignments:
        if change.id in seen:
            duplicates += 1
            continue
        scope = assignment_scope(change.subject)
        late = too_late(change.time_us, scope, cutoffs.get(scope))
        if late is not None:
            dead.append(refused(late, change.id, message))
            continue
        seen.add(change.id)
        newest = change.time_us if newest is None else max(newest, change.time_us)
        without_postings.append((change.id, change.time_us, scope))
        gpu = timeline_key(change, lambda key: timelines.get(key, view.timelines.get(key, ())))
        timelines[gpu] = fold_assignment(timelines.get(gpu, view.timelines.get(gpu, ())), change)
        if isinstance(change.data, GpuAssigned):
            assigned[gpu] = (change, message)
        first = changed[gpu].from_us if gpu in changed else change.time_us
        changed[gpu] = Change(min(first, change.time_us), change, message)
    audit: list[AuditEntry] = []
    audited = set(view.audited)
    for entry in batch.audited:
        if entry.event_id not in audited:
            audited.add(entry.event_id)
            audit.append(entry)
    owners = learned_owners((e for e, _ in batch.identities), view.job_owners)
    fixes = _Corrections(view, cost_centres or {})
    # a job's own usage first: usage naming a job goes to that job once its owner is known
    # (from its JobSubmitted, JobStarted or GpuAssigned), whenever its GPU was assigned to it;
    # then usage the timelines changed here had split among their holders, split again
    for made in (
        *fixes.by_identity(batch, owners),
        *fixes.by_assignment(assigned, timelines),
        *fixes.by_timeline(changed, timelines),
    ):
        if isinstance(made, DeadLetter):
            dead.append(made)
            continue
        transactions.append(made)
    derived = len(transactions)
    gained = fixes.gained  # what the re-postings add to their jobs' usage settles their holds
    for settlement in holds.settle([t.txn for t in gained]):
        transactions.append(replace(gained[settlement.last_usage], txn=settlement.txn))
    if settle_at_end:
        holds.finish(batch.ended)
        if sealed is not None and last is not None:
            ended = holds.settle_ended(sealed.through_us, sealed.job_usage(), sealed.covered())
            transactions.extend(sourced(ended, last))
    elif newest is not None and last is not None:
        transactions.extend(sourced(holds.expire(newest), last))
    return Folded(
        transactions=tuple(transactions),
        dead=tuple(dead),
        changes=StateChanges(
            holds=holds.changed(),
            baselines=holds.baselines_changed(),
            baselines_dropped=holds.baselines_dropped(),
            jobs_ended=batch.ended,
            seen=without_postings,
            timelines=timelines,
            audit=audit,
            reversals=fixes.reversals,
            job_owners=owners,
            awaiting=fixes.awaiting,
            resolved=fixes.resolved,
        ),
        duplicates=duplicates,
        derived_from=derived,
    )


def timeline_key(envelope: JobEnvelope, timeline_of: Callable[[str], tuple[Holding, ...]]) -> str:
    """The timeline an assignment event changes: its GPU's (`subject`), but a GPU share's is
    the GPU it is a share of (`ledger.fractional.share_parent`), where samples find it — when
    its `GpuAssigned` says the share (an assignment without one keeps the share's own key),
    and for a `GpuReleased` when that GPU's timeline holds the job's open share."""
    gpu = share_parent(envelope.subject)
    event = envelope.data
    if gpu is None:
        return envelope.subject
    if isinstance(event, GpuAssigned):
        return gpu if event.share is not None else envelope.subject
    held = any(
        h.share is not None and h.to_us is None and h.owner.job_id == event.job_id
        for h in timeline_of(gpu)
    )
    return gpu if held else envelope.subject


def fold_assignment(timeline: tuple[Holding, ...], envelope: JobEnvelope) -> tuple[Holding, ...]:
    """A GPU's timeline after one `GpuAssigned` or `GpuReleased`."""
    event = envelope.data
    if isinstance(event, GpuAssigned):
        owner = Owner(event.team, event.project, event.user, event.job_id)
        holding = Holding(event.gpu_uuid, owner, event.time_us, share=event.share)
        timeline = assign(timeline, holding)
    elif isinstance(event, GpuReleased):
        timeline = release(timeline, event.job_id, event.time_us)
    return forget_before(timeline, envelope.time_us - HOLDING_MEMORY_US)


@dataclass(frozen=True, slots=True)
class Change:
    """A batch's changes of one assignment timeline: the earliest time one of them changes it
    from, and the last of them (with its message), which the corrections they cause name."""

    from_us: int
    envelope: JobEnvelope
    message: ConsumedMessage


class _Corrections:
    """The corrections one jobs batch makes (`ledger.job_owners`): usage awaiting an owner the
    batch makes known, or a change of the timeline that split it, reversed and re-posted; what
    the re-postings add to their jobs' usage (`gained`, which settles their holds); and what
    the batch's `StateChanges` record."""

    def __init__(self, view: LedgerView, cost_centres: Mapping[str, str]) -> None:
        self.view = view
        self.cost_centres = cost_centres
        self.awaiting: list[tuple[str, str, int]] = []
        self.resolved: list[str] = []
        self.reversals: list[tuple[str, str]] = []
        self.gained: list[SourcedTransaction] = []
        self._done: set[str] = set()

    def by_assignment(
        self,
        assigned: Mapping[str, tuple[JobEnvelope, ConsumedMessage]],
        timelines: Mapping[str, tuple[Holding, ...]],
    ) -> Iterator[SourcedTransaction | DeadLetter]:
        """Unallocated usage of each GPU newly assigned, moved to whoever its new timeline says
        held the GPU over the usage's interval."""
        for gpu, (envelope, message) in sorted(assigned.items()):
            for original in self._open(gpu_key(gpu)):
                span = (original.start_us, original.end_us)
                pieces = [*owners_over(timelines[gpu], *span), *shares_over(timelines[gpu], *span)]
                period = _period(original, self.view)
                fixed = reassigned(original, pieces, self.cost_centres, envelope.id, period)
                yield from self._apply(original, fixed, envelope.id, message, gpu)

    def by_timeline(
        self, changed: Mapping[str, Change], timelines: Mapping[str, tuple[Holding, ...]]
    ) -> Iterator[SourcedTransaction | DeadLetter]:
        """Usage a timeline the batch changed had split among its holders, over an interval
        that ends after the change (a `GpuReleased` folded after the sample that spans it, a
        holder replaced inside it, a holder assigned over its unheld part), split again as the
        timeline now says."""
        for key, change in sorted(changed.items()):
            timeline = timelines[key]
            cause = change.envelope.id
            for original in self._open(held_key(key)):
                if original.end_us <= change.from_us:
                    continue  # the changes move nothing before their time
                span = (original.start_us, original.end_us)
                pieces = [*owners_over(timeline, *span), *shares_over(timeline, *span)]
                period = _period(original, self.view)
                fixed = retimed(original, pieces, self.cost_centres, cause, period)
                yield from self._apply(original, fixed, cause, change.message, key)

    def by_identity(
        self, batch: DecodedJobs, owners: Mapping[str, Owner]
    ) -> Iterator[SourcedTransaction | DeadLetter]:
        """Suspense usage awaiting each job key the batch makes known, moved to its owner."""
        known = {**self.view.job_owners, **owners}
        for envelope, message in batch.identities:
            for key in _job_keys(envelope):
                if key not in owners:
                    continue
                for original in self._open(key):
                    period = _period(original, self.view)
                    fixed = correction(original, known, self.cost_centres, envelope.id, period)
                    yield from self._apply(original, fixed, envelope.id, message)

    def _open(self, key: str) -> list[Transaction]:
        """The transactions awaiting `key` that are neither corrected nor reversed yet."""
        return [
            t
            for t in self.view.awaiting.get(key, ())
            if t.txn_id not in self._done and t.txn_id not in self.view.reversed_by
        ]

    def _apply(
        self,
        original: Transaction,
        fixed: tuple[Transaction, Transaction] | None,
        cause: str,
        message: ConsumedMessage,
        split_by: str | None = None,
    ) -> Iterator[SourcedTransaction | DeadLetter]:
        """`fixed` (the reversal and re-posting of `original`) committed, or refused.
        `split_by`: the key of the timeline that split the re-posting among its holders, whose
        later changes it awaits (`ledger.job_owners.held_key`)."""
        if fixed is None:
            return
        self._done.add(original.txn_id)
        problems = [p for t in fixed if (p := check_transaction(t, self.view.closed))]
        if problems:
            yield refused("; ".join(problems), cause, message)
            return
        reversal, repost = fixed
        yield from sourced(fixed, message)
        self.reversals.append((original.txn_id, reversal.txn_id))
        self.resolved.append(original.txn_id)
        self.awaiting.extend((k, repost.txn_id, repost.end_us) for k in awaited_by(repost))
        if split_by is not None:
            self.awaiting.append((held_key(split_by), repost.txn_id, repost.end_us))
        gain = gained(original, repost)
        if gain is not None:
            self.gained.extend(sourced([gain], message))


def gained(original: Transaction, repost: Transaction) -> Transaction | None:
    """What `repost` adds to each job's consumer usage over `original`, as usage legs (None:
    nothing): a correction settles its jobs' holds by that. What it takes away is not given
    back to a hold: the scheduler releases a job's holds with the decision that releases its
    GPUs, and the hold accounts come to the same once they are released."""
    net: dict[tuple[str, Unit], int] = {}
    first: dict[tuple[str, Unit], Posting] = {}
    for sign, txn in ((-1, original), (1, repost)):
        for p in txn.postings:
            if p.job_id and p.account.startswith(_CONSUMER):
                key = (p.job_id, p.unit)
                net[key] = net.get(key, 0) + sign * p.amount
                if sign > 0:
                    first.setdefault(key, p)
    legs = [replace(first[key], amount=n) for key, n in net.items() if n > 0 and key in first]
    return replace(repost, postings=tuple(legs)) if legs else None


def _period(txn: Transaction, view: LedgerView) -> str:
    """Where a correction of `txn` is booked: its period, or the next open one."""
    return booking_period(txn.period, view.closed)
