"""The Ingestor: applies a batch of consumed messages to a store, exactly once.

For each route of the batch (admin events, then the jobs topic, then inventory reports, then
samples), in one store
commit each: skip offsets the store has applied for this broker incarnation → decode (bad input
becomes a dead letter, never an exception) → load the route's view from the store once → fold
(pure) → give derived transactions ids the ledger has not applied → validate every transaction
(a refused one becomes a dead letter and is never committed) → keep what the ingestor's shard
role keeps (`ledger.ingest.shards`: everything in `WHOLE`, the default) → the caller's
`confirm`, when given (the worker's broker-incarnation check: it raises to refuse the batch, and
then nothing more of it commits) → commit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, tzinfo

from ledger.admin import AdminView, ShardsSealedThrough, decode_admin_message
from ledger.balances import ShardStamp
from ledger.events import DeadLetter, decode_message, encode_dead_letter, event_id
from ledger.fleet_alerts import alert_key, encode_fleet_alert
from ledger.holds import LEDGER_HOLDS_SOURCE
from ledger.idle import IdleAlert, IdlePolicy, encode_alert
from ledger.ingest.admin import admin_keys, closes_a_period, fold_admin
from ledger.ingest.allowances import allowances_due, with_allowances
from ledger.ingest.batch import Folded, FoldRules, decode_all
from ledger.ingest.inventory import INVENTORY_KEYS, fold_inventory
from ledger.ingest.jobs import DecodedJobs, fold_jobs
from ledger.ingest.samples import fold_samples, sample_keys
from ledger.ingest.sealed import newest_sealed, with_sealed_through, without_spending
from ledger.ingest.shards import Route, ShardRole, ShardRoleError, kept_by, refusal
from ledger.ingest.validation import validate_batch, validate_columns
from ledger.inventory import encode_record, record_id
from ledger.inventory.health_events import decode_inventory_message
from ledger.periods import period_label
from ledger.posting_columns import PostingColumns
from ledger.pricing import PriceBook
from ledger.store.port import (
    NO_COMMIT,
    CommitResult,
    ConsumedMessage,
    LedgerStore,
    OutboxMessage,
    PartitionKey,
    SourcedTransaction,
    message_ranges,
)


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
    inventory_reports: int = 0


@dataclass(frozen=True, slots=True)
class OutputTopics:
    """Where the ingest's own outputs go: idle alerts, dead letters and, when set, balances and
    inventory records (keyed by GPU UUID)."""

    alerts: str = "tally.alerts"
    deadletter: str = "tally.deadletter"
    balances: str | None = None
    inventory: str | None = None


@dataclass(frozen=True, slots=True)
class InputTopics:
    """Which consumed topics carry admin events, holds and inventory reports (every other one
    carries samples)."""

    admin: str = "tally.admin"
    jobs: str = "tally.jobs"
    inventory: str = "tally.inventory-reports"


@dataclass(frozen=True, slots=True)
class _Part:
    """What one route of a batch committed."""

    commit: CommitResult
    dead: tuple[DeadLetter, ...]
    decoded: int
    alerts: tuple[IdleAlert, ...] = ()


class Ingestor:
    """Applies batches of messages from one broker incarnation to one store, as a shard of
    `role` (`ledger.ingest.shards`).

    Recurring allowances are granted by the first samples batch holding a new sample of a month
    in `WHOLE`; in `GLOBAL`, which takes no samples, by the first jobs batch holding a new hold
    or assignment event of a month (the same rule, `ledger.ingest.allowances`) for the policies
    that do not depend on spending, and from an admin batch applying a `ShardsSealedThrough` for
    every policy, with that batch's hold settlements (`ledger.ingest.sealed`); a `SAMPLES`
    shard grants none. A `SAMPLES` shard given no `shard` stamp publishes no balances either:
    its keys (`account`) would clash with every other shard's; given one
    (`ledger.balances.ShardStamp`: the shard's name and the epoch its writer holds it in), every
    shard's balance messages are keyed by account and shard and carry the epoch
    (`docs/design/several-workers.md`, "Balances").
    """

    def __init__(
        self,
        store: LedgerStore,
        incarnation: str,
        prices: PriceBook,
        cost_centres: Mapping[str, str],
        idle_policy: IdlePolicy | None = None,
        topics: OutputTopics | None = None,
        inputs: InputTopics | None = None,
        zone: tzinfo = UTC,
        role: ShardRole = ShardRole.WHOLE,
        shard: ShardStamp | None = None,
    ) -> None:
        """`zone`: the ledger's time zone (`ledger.store.identity`), whose months usage, holds,
        grants and allowances are booked into; `role`: what part of the ledger this store
        holds (`ledger.ingest.shards`); `shard`: the stamp a sharded ledger's shard publishes its
        balances with (the worker that claims the shard sets it; None: a whole ledger's keys)."""
        self.store = store
        self.role = role
        self.shard = shard
        self.zone = zone
        self.incarnation = incarnation
        self._configured_prices = prices
        self._configured_centres = dict(cost_centres)
        self.idle_policy = idle_policy or IdlePolicy()
        self.rules = self._current_rules()
        self.topics = topics or OutputTopics()
        self.inputs = inputs or InputTopics()
        self._next: dict[PartitionKey, int] = store.applied_offsets(incarnation)
        # The newest month whose allowances are all granted (`None`: not known since the start
        # or since the last admin batch). Only skips work: planning again would grant nothing,
        # so a restarted worker and a rebuild grant exactly what this one does.
        self._granted_through: str | None = None
        # A global shard's newest folded `ShardsSealedThrough` (read once, kept current by its
        # admin batches): what its jobs batches settle ended holds from.
        self._sealed: tuple[ShardsSealedThrough | None] | None = None
        self._confirm: Callable[[], None] | None = None  # the batch's, while `apply` runs

    @property
    def prices(self) -> PriceBook:
        return self.rules.prices

    @property
    def cost_centres(self) -> Mapping[str, str]:
        return self.rules.cost_centres

    def next_offset(self, topic: str, partition: int) -> int:
        return self._next.get((topic, partition), 0)

    def _current_rules(self) -> FoldRules:
        """Prices and cost centres as the configuration and the applied admin events say.

        A `PriceSet` applies from its effective time (`PriceBook` never prices backwards), and a
        `TeamDefined` moves the team's later usage to its cost centre.
        """
        teams = self.store.admin_view().teams
        centres = self._configured_centres | {team: t.cost_centre for team, t in teams.items()}
        prices = self.store.price_book(self._configured_prices)
        return FoldRules(prices, centres, self.idle_policy, self.zone)

    def apply(
        self, messages: Sequence[ConsumedMessage], confirm: Callable[[], None] | None = None
    ) -> IngestResult:
        """Apply `messages` (module docstring). `confirm` is called before each of the batch's
        commits, after its fold: an exception from it refuses the batch (no commit of it
        happens from there on) and is raised here."""
        self._confirm = confirm
        try:
            return self._apply(messages)
        finally:
            self._confirm = None

    def _apply(self, messages: Sequence[ConsumedMessage]) -> IngestResult:
        fresh = [m for m in messages if m.offset >= self._next.get((m.topic, m.partition), 0)]
        admin = [m for m in fresh if m.topic == self.inputs.admin]
        jobs = [m for m in fresh if m.topic == self.inputs.jobs]
        reports = [m for m in fresh if m.topic == self.inputs.inventory]
        routed = (self.inputs.admin, self.inputs.jobs, self.inputs.inventory)
        samples = [m for m in fresh if m.topic not in routed]
        for route, messages_of in ((Route.INVENTORY, reports), (Route.SAMPLES, samples)):
            problem = refusal(self.role, route)
            if messages_of and problem is not None:  # before anything of the batch commits
                topics = sorted({m.topic for m in messages_of})
                raise ShardRoleError(f"{problem}: messages of {', '.join(topics)}")
        admin_part = self._apply_admin(admin) if admin else None
        if admin_part is not None:
            self.rules = self._current_rules()
            self._granted_through = None
            self._sealed = None
        jobs_part = self._apply_jobs(jobs) if jobs else None
        inventory_part = self._apply_inventory(reports) if reports else None
        sample_part = self._apply_samples(samples) if samples else None
        parts = [p for p in (admin_part, jobs_part, inventory_part, sample_part) if p is not None]
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
            inventory_reports=inventory_part.decoded if inventory_part else 0,
        )

    # ------------------------------------------------------------------ the routes

    def _apply_samples(self, fresh: Sequence[ConsumedMessage]) -> _Part:
        decoded, dead = decode_all(fresh, decode_message)
        view = self.store.load_view(sample_keys(decoded))
        folded = fold_samples(decoded, view, self.rules)
        through = None
        # Only samples the ledger takes move its clock: a resent one (seen before) or a refused
        # one (too late to deduplicate, unpriced, …) changes nothing.
        refused = {letter.event_id for letter in folded.dead if letter.event_id}
        new = [
            envelope.time_us
            for envelope, _ in decoded
            if envelope.id not in view.seen and envelope.id not in refused
        ]
        if new and self.role is ShardRole.WHOLE:  # a samples shard grants none
            folded, through = self._allowances(folded, new, view.closed, decoded[-1][1])
        part = self._commit(fresh, folded, dead, len(decoded), view.closed, Route.SAMPLES)
        if through is not None:
            self._granted_through = through
        return part

    def _allowances(
        self,
        folded: Folded,
        new: Sequence[int],
        closed: frozenset[str],
        last: ConsumedMessage,
    ) -> tuple[Folded, str | None]:
        """`folded` with the recurring allowances due up to the month of the newest of `new`
        (times of the batch's events new to the ledger), sourced to `last`; and that month when
        every allowance up to it is granted (None: nothing planned, or more months are due)."""
        if not new:
            return folded, None
        through = period_label(max(new), self.rules.zone)
        if self._granted_through is not None and through <= self._granted_through:
            return folded, None
        admin = self.store.admin_view()
        if self.role is ShardRole.GLOBAL:  # policies that spend wait for the shards' watermark
            admin = without_spending(admin)
        if allowances_due(admin, through, self.rules.zone):
            folded, complete = with_allowances(
                folded,
                admin,
                through,
                closed,
                self.store.balance_rows(),
                self.rules.cost_centres,
                last,
                self.rules.zone,
            )
            if not complete:
                return folded, None  # more months are due: plan again with the next batch
        return folded, through

    def _apply_jobs(self, fresh: Sequence[ConsumedMessage]) -> _Part:
        batch = DecodedJobs(fresh)
        view = self.store.load_view(batch.keys())
        is_global = self.role is ShardRole.GLOBAL
        folded = fold_jobs(
            batch,
            view,
            fresh[-1],
            self.rules.zone,
            self.rules.cost_centres,
            self._newest_sealed() if is_global else None,
            settle_at_end=is_global,
        )
        through = None
        if is_global:  # no samples here: the jobs events are the clock
            refused = {letter.event_id for letter in folded.dead if letter.event_id}
            events = [(e.id, e.time_us) for e, _ in batch.holds] + [
                (e.id, e.time_us) for e, _ in batch.assignments
            ]
            new = [t for id_, t in events if id_ not in view.seen and id_ not in refused]
            folded, through = self._allowances(folded, new, view.closed, fresh[-1])
        part = self._commit(fresh, folded, batch.dead, batch.count, view.closed, Route.JOBS)
        if through is not None:
            self._granted_through = through
        return part

    def _apply_inventory(self, fresh: Sequence[ConsumedMessage]) -> _Part:
        decoded, dead = decode_all(fresh, decode_inventory_message)
        view = self.store.load_view(INVENTORY_KEYS)
        folded = fold_inventory(decoded, view)
        return self._commit(fresh, folded, dead, len(decoded), view.closed, Route.INVENTORY)

    def _apply_admin(self, fresh: Sequence[ConsumedMessage]) -> _Part:
        decoded, dead = decode_all(fresh, decode_admin_message)
        view = self.store.load_view(admin_keys(decoded))
        if closes_a_period(decoded, view):
            self.store.seal()  # the close's checksum must see every posting of the period
        is_global = self.role is ShardRole.GLOBAL
        folded = fold_admin(
            decoded,
            view,
            self.rules.cost_centres,
            self.rules.zone,
            targets_elsewhere=is_global,
            global_shard=is_global,
        )
        sealed = newest_sealed(folded) if is_global else None
        if sealed is not None:
            sealed_id, event = sealed
            folded = with_sealed_through(
                folded,
                event,
                next(m for e, m in decoded if e.id == sealed_id),
                view,
                AdminView.from_log([*self.store.admin_entries(), *folded.changes.admin]),
                self.store.balance_rows(),
                self.rules.cost_centres,
                self.rules.zone,
            )
        return self._commit(fresh, folded, dead, len(decoded), view.closed, Route.ADMIN)

    def _newest_sealed(self) -> ShardsSealedThrough | None:
        """A global shard's newest folded `ShardsSealedThrough` (cached until the next admin
        batch)."""
        if self._sealed is None:
            self._sealed = (self.store.admin_view().sealed,)
        return self._sealed[0]

    # ------------------------------------------------------------------ shared steps

    def _commit(
        self,
        fresh: Sequence[ConsumedMessage],
        folded: Folded,
        decode_dead: Sequence[DeadLetter],
        decoded: int,
        closed: frozenset[str],
        route: Route,
    ) -> _Part:
        if self.role is not ShardRole.WHOLE:
            folded = kept_by(self.role, route, replace(folded, dead=(*decode_dead, *folded.dead)))
            decode_dead = ()
        start = folded.derived_from
        transactions = self._own_ids(list(folded.transactions), start)
        # The folds checked what they made from events; what the ledger derived is checked here.
        derived, refused = validate_batch(transactions[start:], closed)
        valid = transactions[:start] + derived
        columns, refused_columns = _checked_columns(folded.columns, closed)
        dead = [*decode_dead, *folded.dead, *refused, *refused_columns]
        outbox = (
            [
                OutboxMessage(a.id, self.topics.alerts, a.gpu_uuid.encode(), encode_alert(a))
                for a in folded.alerts
            ]
            + [
                OutboxMessage(a.id, self.topics.alerts, alert_key(a), encode_fleet_alert(a))
                for a in folded.fleet_alerts
            ]
            + [
                OutboxMessage(
                    event_id("tally://deadletter", f"{d.topic}/{d.partition}/{d.offset}", index),
                    self.topics.deadletter,
                    None,
                    encode_dead_letter(d, self.incarnation),
                )
                for index, d in enumerate(dead)
            ]
        )
        inventory = self.topics.inventory
        if inventory is not None:
            outbox.extend(
                OutboxMessage(record_id(g), inventory, g.uuid.encode(), encode_record(g))
                for g in folded.changes.inventory.values()
            )
        ranges = message_ranges(fresh)
        if self._confirm is not None:
            self._confirm()
        commit = self.store.commit(
            self.incarnation,
            ranges,
            valid,
            dead,
            folded.idle_states,
            outbox,
            folded.changes,
            None if self.role is ShardRole.SAMPLES and self.shard is None else self.topics.balances,
            raw=fresh,
            columns=columns,
            balances_shard=self.shard,
            job_usage=self.role is not ShardRole.WHOLE,
        )
        for r in ranges:
            self._next[(r.topic, r.partition)] = r.last + 1
        commit = replace(commit, duplicates=commit.duplicates + folded.duplicates)
        return _Part(commit, tuple(dead), decoded, folded.alerts)

    def _own_ids(
        self, transactions: list[SourcedTransaction], start: int
    ) -> list[SourcedTransaction]:
        """Give each transaction the ledger derived itself (settlements and expiries of holds,
        from `start` on) an id the ledger has not applied yet.

        A derived id repeats only when the event it derives from was applied again after the
        dedupe window forgot it (a hold placed anew expires with its first life's id). The
        store would drop the repeat while the hold change it carries is committed; a fresh id,
        derived deterministically from the old one, keeps postings and holds in step.
        """
        if start == len(transactions):
            return transactions
        taken = self.store.seen_ids([t.txn.txn_id for t in transactions[start:]])
        if not taken:
            return transactions
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
        return transactions


def _checked_columns(
    columns: PostingColumns | None, closed: frozenset[str]
) -> tuple[PostingColumns | None, list[DeadLetter]]:
    """`columns` less the transactions `validate_columns` refuses, and a letter for each."""
    if columns is None:
        return None, []
    problems = validate_columns(columns, closed)
    if not problems:
        return columns, []
    letters = [
        DeadLetter(
            reason=reason,
            payload="",
            event_id=columns.rows[i][0],
            topic=columns.rows[i][9],
            partition=columns.rows[i][10],
            offset=columns.rows[i][11],
        )
        for i, reason in sorted(problems.items())
    ]
    return columns.without(problems.keys()), letters
