"""Ingest: fold a batch of consumed messages into the ledger store, exactly once.

`Ingestor.apply` is what a stream agent calls with the messages of one batch. Messages are
routed by topic: the admin topic carries admin events (`ledger.admin`), the jobs topic carries
holds (`ledger.holds`) and the scheduler's GPU assignments (`GpuAssigned` / `GpuReleased`, folded
into each GPU's timeline: `ledger.assignments`; its other job events are passed over), every
other topic carries GPU samples. For each route it
1. skips messages at offsets the store has already applied for this broker incarnation,
2. decodes each message (bad input becomes a dead letter, never an exception),
3. drops events whose id the store has applied before (and repeats within the batch),
4. folds the events into transactions and state changes,
5. commits transactions, offset ranges, state, dead letters, the outbox (alerts, dead letters
   and changed balances to publish) and the route's messages themselves (the raw-event archive)
   in one store transaction: one batch of the archive per route and call.

Everything a route's fold reads (open holds, idle states, seen ids, admin state, closed
periods) is itself the fold of earlier batches, so replaying the archive batch by batch, each
batch's messages in their archived order, reproduces the ledger (`ledger.rebuild`).

Samples are attributed to usage transactions (unpriced models become dead letters); a sample
that names no owner goes to whoever the GPU's timeline says held it over the sample's interval
(split by time when the holder changed), else to unallocated capacity. A sample is attributed
by the timeline as folded when its batch is applied: the scheduler publishes an assignment
before it starts the job, so the assignment normally precedes the job's samples, and a replay
of the archive attributes the same way. Samples are booked into
the next open period when their own is closed, flagged by the idle detector (`ledger.idle`,
stepped per GPU in sample-time order, raising alerts), and settle the open holds of their jobs;
holds whose expiry the batch's newest new event has passed are released (a duplicate moves no
clock: applying an event twice has the effect of applying it once).

Admin events take effect in offset order within a batch. A batch that closes a period seals the
store first, so the close's checksum covers every posting booked into the period, including
those of the same batch before the close; postings after it go to the next open period.

The broker incarnation (the Kafka cluster id) scopes offsets: an embedded broker restarted with
empty partitions is a new incarnation, so its offset 0 is new data, not something already seen.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from ledger.admin import (
    REVERSIBLE,
    AdjustmentRecorded,
    AdminEnvelope,
    AppliedAdmin,
    BudgetGranted,
    PeriodClosed,
    QuotaSet,
    TeamDefined,
    adjustment_transaction,
    decode_admin_message,
    grant_transaction,
    reversal_transaction,
)
from ledger.assignments import (
    HOLDING_MEMORY_US,
    Holding,
    OwnedPiece,
    assign,
    forget_before,
    main_holder,
    owners_over,
    release,
)
from ledger.attribution import attribute_sample, owner_shares
from ledger.closing import booking_period
from ledger.errors import PricingError
from ledger.events import (
    DeadLetter,
    Owner,
    decode_message,
    encode_dead_letter,
    event_id,
)
from ledger.events import SampleEnvelope as Envelope
from ledger.holds import (
    LEDGER_HOLDS_SOURCE,
    BookPeriod,
    HoldBook,
    HoldEnvelope,
    HoldPlaced,
    decode_jobs_message,
)
from ledger.idle import GpuIdleState, IdleAlert, IdleObservation, IdlePolicy, encode_alert, step
from ledger.job_events import GpuAssigned, GpuReleased, JobEnvelope
from ledger.periods import period_label
from ledger.postings import Transaction
from ledger.pricing import PriceBook
from ledger.store import (
    NO_COMMIT,
    CommitResult,
    ConsumedMessage,
    LedgerStore,
    OutboxMessage,
    PartitionKey,
    SourcedTransaction,
    StateChanges,
    ranges_from_offsets,
)
from ledger.units import Unit

__all__ = ["ConsumedMessage", "IngestResult", "Ingestor", "InputTopics", "OutputTopics"]


@dataclass(frozen=True, slots=True)
class IngestResult:
    messages: int
    skipped_messages: int
    samples: int
    commit: CommitResult
    dead_letters: tuple[DeadLetter, ...]
    alerts: tuple[IdleAlert, ...] = ()
    admin_events: int = 0
    hold_events: int = 0


@dataclass(frozen=True, slots=True)
class OutputTopics:
    """Where the ingest's own outputs go: idle alerts, dead letters and, when set, balances."""

    alerts: str = "tally.alerts"
    deadletter: str = "tally.deadletter"
    balances: str | None = None


@dataclass(frozen=True, slots=True)
class InputTopics:
    """Which consumed topics carry admin events and holds (every other one carries samples)."""

    admin: str = "tally.admin"
    jobs: str = "tally.jobs"


@dataclass(frozen=True, slots=True)
class _Part:
    """What one route of a batch folded into."""

    commit: CommitResult
    dead: tuple[DeadLetter, ...]
    decoded: int
    alerts: tuple[IdleAlert, ...] = ()


class Ingestor:
    """Applies batches of messages from one broker incarnation to one store."""

    def __init__(
        self,
        store: LedgerStore,
        incarnation: str,
        prices: PriceBook,
        cost_centres: Mapping[str, str],
        idle_policy: IdlePolicy | None = None,
        topics: OutputTopics | None = None,
        inputs: InputTopics | None = None,
    ) -> None:
        self.store = store
        self.incarnation = incarnation
        self._configured_prices = prices
        self._configured_centres = dict(cost_centres)
        self.prices = prices
        self.cost_centres = dict(cost_centres)
        self._load_admin_state()
        self.idle_policy = idle_policy or IdlePolicy()
        self.topics = topics or OutputTopics()
        self.inputs = inputs or InputTopics()
        self._next: dict[PartitionKey, int] = store.applied_offsets(incarnation)

    def next_offset(self, topic: str, partition: int) -> int:
        return self._next.get((topic, partition), 0)

    def _load_admin_state(self) -> None:
        """Prices and cost centres as the configuration and the applied admin events say.

        A `PriceSet` applies from its effective time (`PriceBook` never prices backwards), and a
        `TeamDefined` moves the team's later usage to its cost centre.
        """
        self.prices = self.store.price_book(self._configured_prices)
        teams = self.store.admin_view().teams
        self.cost_centres = self._configured_centres | {
            team: t.cost_centre for team, t in teams.items()
        }

    def apply(self, messages: Sequence[ConsumedMessage]) -> IngestResult:
        fresh = [m for m in messages if m.offset >= self._next.get((m.topic, m.partition), 0)]
        admin = [m for m in fresh if m.topic == self.inputs.admin]
        jobs = [m for m in fresh if m.topic == self.inputs.jobs]
        samples = [m for m in fresh if m.topic not in (self.inputs.admin, self.inputs.jobs)]
        admin_part = self._apply_admin(admin) if admin else None
        if admin_part is not None:
            self._load_admin_state()
        jobs_part = self._apply_jobs(jobs) if jobs else None
        sample_part = self._apply_samples(samples) if samples else None
        parts = [p for p in (admin_part, jobs_part, sample_part) if p is not None]
        commit = NO_COMMIT
        for part in parts:
            commit = commit + part.commit
        return IngestResult(
            messages=len(messages),
            skipped_messages=len(messages) - len(fresh),
            samples=sample_part.decoded if sample_part else 0,
            commit=commit,
            dead_letters=tuple(d for p in parts for d in p.dead),
            alerts=sample_part.alerts if sample_part else (),
            admin_events=admin_part.decoded if admin_part else 0,
            hold_events=jobs_part.decoded if jobs_part else 0,
        )

    # ------------------------------------------------------------------ shared steps

    def _commit(
        self,
        fresh: Sequence[ConsumedMessage],
        transactions: Sequence[SourcedTransaction],
        dead: Sequence[DeadLetter],
        changes: StateChanges,
        idle_states: Sequence[GpuIdleState] = (),
        alerts: Sequence[IdleAlert] = (),
    ) -> CommitResult:
        outbox = [
            OutboxMessage(a.id, self.topics.alerts, a.gpu_uuid.encode(), encode_alert(a))
            for a in alerts
        ] + [
            OutboxMessage(
                event_id("tally://deadletter", f"{d.topic}/{d.partition}/{d.offset}", index),
                self.topics.deadletter,
                None,
                encode_dead_letter(d, self.incarnation),
            )
            for index, d in enumerate(dead)
        ]
        ranges = ranges_from_offsets((m.topic, m.partition, m.offset) for m in fresh)
        commit = self.store.commit(
            self.incarnation,
            ranges,
            transactions,
            dead,
            idle_states,
            outbox,
            changes,
            self.topics.balances,
            raw=fresh,
        )
        for r in ranges:
            self._next[(r.topic, r.partition)] = r.last + 1
        return commit

    @staticmethod
    def _booker(closed: frozenset[str]) -> BookPeriod:
        def book(time_us: int) -> str:
            return booking_period(period_label(time_us), closed)

        return book

    # ------------------------------------------------------------------ samples

    def _apply_samples(self, fresh: Sequence[ConsumedMessage]) -> _Part:
        dead: list[DeadLetter] = []
        decoded: list[tuple[Envelope, ConsumedMessage]] = []
        for message in fresh:
            envelopes, bad = decode_message(message.value)
            dead.extend(_located(letter, message) for letter in bad)
            decoded.extend((envelope, message) for envelope in envelopes)
        seen = self.store.seen_ids([e.id for e, _ in decoded])
        closed = self.store.closed_period_labels()
        timelines = self.store.gpu_timelines({e.data.gpu_uuid for e, _ in decoded})
        transactions: list[SourcedTransaction] = []
        observed: list[tuple[Envelope, int, Owner | None]] = []
        duplicates = 0
        newest: int | None = None  # of the events new to the ledger: a duplicate moves nothing
        for envelope, message in decoded:
            if envelope.id in seen:
                duplicates += 1
                continue
            seen.add(envelope.id)
            newest = envelope.time_us if newest is None else max(newest, envelope.time_us)
            held = _held_over(timelines.get(envelope.data.gpu_uuid), envelope)
            try:
                txn = attribute_sample(envelope, self.prices, self.cost_centres, held)
            except PricingError as exc:
                letter = DeadLetter(reason=str(exc), payload="", event_id=envelope.id)
                dead.append(_located(letter, message))
                continue
            if txn.period in closed:  # late usage: a flagged prior-period posting
                txn = replace(txn, period=booking_period(txn.period, closed))
            observed.append((envelope, len(transactions), main_holder(held)))
            transactions.append(
                SourcedTransaction(txn, message.topic, message.partition, message.offset)
            )
        states, alerts = self._detect_idle(observed, transactions)
        holds = HoldBook(self.store.open_holds(), self._booker(closed))
        derived = len(transactions)
        for settlement in holds.settle([t.txn for t in transactions]):
            source = transactions[settlement.last_usage]
            transactions.append(replace(source, txn=settlement.txn))
        if newest is not None:
            transactions.extend(_sourced(holds.expire(newest), fresh[-1]))
        self._own_ids(transactions, derived)
        commit = self._commit(
            fresh, transactions, dead, StateChanges(holds=holds.changed()), states, alerts
        )
        return _Part(
            replace(commit, duplicates=commit.duplicates + duplicates),
            tuple(dead),
            len(decoded),
            tuple(alerts),
        )

    def _detect_idle(
        self,
        observed: list[tuple[Envelope, int, Owner | None]],
        transactions: list[SourcedTransaction],
    ) -> tuple[list[GpuIdleState], list[IdleAlert]]:
        """Step each GPU's idle detector in sample-time order; flag confirmed-idle usage. A GPU
        the scheduler assigned is allocated even when its sample names no owner."""
        if not observed:
            return [], []
        observed.sort(key=lambda item: (item[0].subject, item[0].time_us))
        states = self.store.idle_states(sorted({e.subject for e, _, _ in observed}))
        alerts: list[IdleAlert] = []
        for envelope, index, holder in observed:
            item = transactions[index]
            txn = item.txn
            sample = envelope.data
            shares = owner_shares(sample)
            owner = (shares[0][0] if shares else None) or holder
            gpu_ms = cost = 0
            for posting in txn.postings:
                if posting.amount > 0:
                    if posting.unit is Unit.GPU_MS:
                        gpu_ms += posting.amount
                    elif posting.unit is Unit.MONEY:
                        cost += posting.amount
            obs = IdleObservation(
                subject=envelope.subject,
                gpu_uuid=sample.gpu_uuid,
                node=sample.node,
                pool=sample.pool,
                model=sample.model,
                owner=owner,
                util_pct=sample.util_gpu_pct,
                start_us=sample.start_us,
                end_us=sample.sample_time_us,
                gpu_ms=gpu_ms,
                cost_micros=cost,
            )
            state, raised, flag = step(states.get(envelope.subject), obs, self.idle_policy)
            states[envelope.subject] = state
            alerts.extend(raised)
            if flag:
                transactions[index] = replace(item, txn=replace(txn, idle=True))
        return list(states.values()), alerts

    # ------------------------------------------------------------------ holds

    def _own_ids(self, transactions: list[SourcedTransaction], start: int) -> None:
        """Give each transaction the ledger derived itself (settlements and expiries of holds,
        from `start` on) an id the ledger has not applied yet.

        A derived id repeats only when the event it derives from was applied again after the
        dedupe window forgot it (a hold placed anew expires with its first life's id). The
        store would drop the repeat while the hold change it carries is committed; a fresh id,
        derived deterministically from the old one, keeps postings and holds in step.
        """
        if start == len(transactions):
            return
        taken = self.store.seen_ids([t.txn.txn_id for t in transactions[start:]])
        if not taken:
            return
        for index in range(start, len(transactions)):
            item = transactions[index]
            txn_id, again = item.txn.txn_id, 0
            while txn_id in taken:
                again += 1
                txn_id = event_id(LEDGER_HOLDS_SOURCE, f"{item.txn.txn_id}/again", again)
                if txn_id not in taken:
                    taken |= self.store.seen_ids([txn_id])
            if txn_id != item.txn.txn_id:
                taken.add(txn_id)
                transactions[index] = replace(item, txn=replace(item.txn, txn_id=txn_id))

    def _apply_jobs(self, fresh: Sequence[ConsumedMessage]) -> _Part:
        dead: list[DeadLetter] = []
        decoded: list[tuple[HoldEnvelope, ConsumedMessage]] = []
        assignments: list[JobEnvelope] = []
        for message in fresh:
            read = decode_jobs_message(message.value)
            dead.extend(_located(letter, message) for letter in read.dead)
            decoded.extend((envelope, message) for envelope in read.holds)
            assignments.extend(read.assignments)
        seen = self.store.seen_ids([e.id for e, _ in decoded] + [e.id for e in assignments])
        holds = HoldBook(self.store.open_holds(), self._booker(self.store.closed_period_labels()))
        transactions: list[SourcedTransaction] = []
        without_postings: list[tuple[str, int]] = []
        duplicates = 0
        newest: int | None = None  # of the events new to the ledger: a duplicate moves nothing
        for envelope, message in decoded:
            if envelope.id in seen:
                duplicates += 1
                continue
            seen.add(envelope.id)
            newest = envelope.time_us if newest is None else max(newest, envelope.time_us)
            if isinstance(envelope.data, HoldPlaced):
                placed = holds.place(envelope)
                if isinstance(placed, str):
                    letter = DeadLetter(reason=placed, payload="", event_id=envelope.id)
                    dead.append(_located(letter, message))
                    continue
                transactions.extend(_sourced([placed], message))
                continue
            released = holds.release(envelope)
            if released is None:
                without_postings.append((envelope.id, envelope.time_us))
            else:
                transactions.extend(_sourced([released], message))
        loaded = self.store.gpu_timelines({e.subject for e in assignments if e.id not in seen})
        timelines: dict[str, tuple[Holding, ...]] = {}
        for change in assignments:
            if change.id in seen:
                duplicates += 1
                continue
            seen.add(change.id)
            newest = change.time_us if newest is None else max(newest, change.time_us)
            without_postings.append((change.id, change.time_us))
            gpu = change.subject
            timelines[gpu] = _fold_assignment(timelines.get(gpu, loaded.get(gpu, ())), change)
        derived = len(transactions)
        if newest is not None:
            transactions.extend(_sourced(holds.expire(newest), fresh[-1]))
        self._own_ids(transactions, derived)
        changes = StateChanges(holds=holds.changed(), seen=without_postings, timelines=timelines)
        commit = self._commit(fresh, transactions, dead, changes)
        return _Part(
            replace(commit, duplicates=commit.duplicates + duplicates),
            tuple(dead),
            len(decoded) + len(assignments),
        )

    # ------------------------------------------------------------------ admin

    def _apply_admin(self, fresh: Sequence[ConsumedMessage]) -> _Part:
        dead: list[DeadLetter] = []
        decoded: list[tuple[AdminEnvelope, ConsumedMessage]] = []
        for message in fresh:
            envelopes, bad = decode_admin_message(message.value)
            dead.extend(_located(letter, message) for letter in bad)
            decoded.extend((envelope, message) for envelope in envelopes)
        applied = self.store.admin_ids([e.id for e, _ in decoded])
        closed = set(self.store.closed_period_labels())
        if any(
            isinstance(e.data, PeriodClosed) and e.data.period not in closed and e.id not in applied
            for e, _ in decoded
        ):
            self.store.seal()  # the close's checksum must see every posting of the period
        fold = _AdminFold(self.store, closed, self.cost_centres)
        duplicates = 0
        for envelope, message in decoded:
            if envelope.id in applied:
                duplicates += 1
                continue
            applied.add(envelope.id)
            problem = fold.apply(envelope, message)
            if problem is not None:
                letter = DeadLetter(reason=problem, payload="", event_id=envelope.id)
                dead.append(_located(letter, message))
        changes = StateChanges(admin=fold.entries, reversals=fold.reversals)
        commit = self._commit(fresh, fold.transactions, dead, changes)
        return _Part(
            replace(commit, duplicates=commit.duplicates + duplicates), tuple(dead), len(decoded)
        )


class _AdminFold:
    """The admin events of one batch, folded in order into transactions and log entries."""

    def __init__(self, store: LedgerStore, closed: set[str], cost_centres: Mapping[str, str]):
        self.store = store
        self.closed = closed
        self.view = store.admin_view()
        self.centres = dict(cost_centres) | {
            team: t.cost_centre for team, t in self.view.teams.items()
        }
        self.teams = dict(self.view.teams)
        self.quotas = dict(self.view.quotas)
        self.totals: dict[tuple[str, str, Unit], int] = {}
        self.pending: dict[str, Transaction] = {}
        self.reversed: set[str] = set()
        self.transactions: list[SourcedTransaction] = []
        self.entries: list[AppliedAdmin] = []
        self.reversals: list[tuple[str, str]] = []

    def apply(self, envelope: AdminEnvelope, message: ConsumedMessage) -> str | None:
        """Fold one event; the reason it is refused, or None."""
        event = envelope.data
        outcome = "applied"
        txn: Transaction | None = None
        if isinstance(event, BudgetGranted):
            if event.period in self.closed:
                return f"budget for {event.period} refused: the period is closed"
            key = (event.team, event.period, event.unit)
            total = self.totals.get(key)
            if total is None:
                total = self.store.budget_total(*key)
            if event.expected_total is not None and event.expected_total != total:
                return (
                    f"stale grant: computed against a total of {event.expected_total} "
                    f"{event.unit}, the ledger has {total}"
                )
            self.totals[key] = total + event.amount
            txn = grant_transaction(envelope, self.centres.get(event.team))
        elif isinstance(event, AdjustmentRecorded) and event.reverses_txn is not None:
            target = event.reverses_txn
            original = self.pending.get(target) or self.store.find_transaction(target)
            if original is None:
                return f"no transaction {target} to reverse"
            if original.kind not in REVERSIBLE:
                return f"a {original.kind} transaction is not reversed by hand"
            earlier = target if target in self.reversed else self.store.reversed_by(target)
            if earlier is not None:
                return f"transaction {target} is already reversed"
            self.reversed.add(target)
            self.reversals.append((target, envelope.id))
            period = booking_period(original.period, self.closed)
            txn = reversal_transaction(envelope, original, period)
        elif isinstance(event, AdjustmentRecorded):
            assert event.period is not None
            period = booking_period(event.period, self.closed)
            txn = adjustment_transaction(envelope, period, self.centres)
        elif isinstance(event, PeriodClosed):
            if event.period in self.closed:
                outcome = "unchanged: already closed"
            self.closed.add(event.period)
        elif isinstance(event, TeamDefined):
            before = self.teams.get(event.team)
            if before is not None and before.definition == event.definition:
                outcome = "unchanged"
            self.teams[event.team] = event
            self.centres[event.team] = event.cost_centre
        elif isinstance(event, QuotaSet):
            key3 = (event.team, event.pool, event.model)
            quota = self.quotas.get(key3)
            if quota is not None and quota.limits == event.limits:
                outcome = "unchanged"
            self.quotas[key3] = event
        self.entries.append(AppliedAdmin(envelope, outcome))
        if txn is not None:
            self.pending[txn.txn_id] = txn
            self.transactions.append(
                SourcedTransaction(txn, message.topic, message.partition, message.offset)
            )
        return None


def _fold_assignment(timeline: tuple[Holding, ...], envelope: JobEnvelope) -> tuple[Holding, ...]:
    """A GPU's timeline after one `GpuAssigned` or `GpuReleased`."""
    event = envelope.data
    if isinstance(event, GpuAssigned):
        owner = Owner(event.team, event.project, event.user, event.job_id)
        timeline = assign(timeline, Holding(event.gpu_uuid, owner, event.time_us))
    elif isinstance(event, GpuReleased):
        timeline = release(timeline, event.job_id, event.time_us)
    return forget_before(timeline, envelope.time_us - HOLDING_MEMORY_US)


def _held_over(timeline: tuple[Holding, ...] | None, envelope: Envelope) -> list[OwnedPiece]:
    """Who the scheduler says held the sample's GPU over its interval; empty when nobody."""
    if not timeline:
        return []
    sample = envelope.data
    pieces = owners_over(timeline, sample.start_us, sample.sample_time_us)
    return pieces if any(p.owner is not None for p in pieces) else []


def _sourced(txns: Sequence[Transaction], message: ConsumedMessage) -> list[SourcedTransaction]:
    return [SourcedTransaction(t, message.topic, message.partition, message.offset) for t in txns]


def _located(letter: DeadLetter, message: ConsumedMessage) -> DeadLetter:
    return DeadLetter(
        reason=letter.reason,
        payload=letter.payload,
        event_id=letter.event_id,
        topic=message.topic,
        partition=message.partition,
        offset=message.offset,
    )
