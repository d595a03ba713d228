"""The samples route's fold: GPU samples into usage transactions, idle-detector steps and hold
settlements, as a pure function of the batch, the ledger's view and the rules.

A sample applied before is a duplicate; one not seen before whose time is before its GPU's
dedupe cutoff is a dead letter (`ledger.dedupe`: too late to deduplicate), never booked.

An owner that names a job but no team is completed from the job owners the jobs topic made known
(`ledger.job_owners`); one whose job is not known yet is booked to unallocated capacity with its
user and job id kept on the legs, and remembered as awaiting that job's owner (the jobs route
corrects it when the owner becomes known). A sample that names no owner goes to whoever the GPU's
assignment timeline says held it over the sample's interval (split by time when the holder changed;
a MIG instance's sample reads the instance's own timeline, `<GPU UUID>/gi<id>`, where the scheduler
assigned it one), else to unallocated capacity, where it awaits its GPU's assignment for a while (a
`GpuAssigned` consumed after it corrects it); usage the timeline split among its holders awaits
the timeline's later changes the same way (a `GpuReleased` consumed after the sample spanning it
corrects it: `ledger.job_owners.held_key`); an unpriced model is a dead letter. A sample whose
natural period is closed is booked into the next open one. Each GPU subject's idle detector is
stepped in sample-time order and flags confirmed-idle usage (a sample awaiting its job's owner is
observed as that job's, so its correction re-posts the flag the owner's usage would have had); a
sample split among GPU shares steps each share's own detector and flags only its legs, and the
shares its GPU released step theirs without an owner (`ledger.idle_shares`).
Usage settles the open holds of its jobs; holds whose expiry the batch's newest new event has
passed are released (a duplicate moves no clock).

Two paths give the same transactions. The common case (one holder: a whole GPU or a MIG slice
whose owner the sample names, or nobody with no scheduler assignment; an open period; a job
without an open hold) is built straight into `PostingColumns`, without a `Transaction` per
sample; everything else goes through `attribute_usage`. `columnar=False` sends every sample the
per-sample way (the property test compares the two).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from ledger.accounts import capacity_account, consumer_account, unallocated_account
from ledger.assignments import Holding, OwnedPiece, owners_over, shares_over
from ledger.attribution import (
    attribute_usage,
    owner_shares,
    physical_gpu_ms,
    share_split,
    usage_cost,
)
from ledger.closing import booking_period
from ledger.dedupe import sample_scope, too_late
from ledger.errors import PricingError
from ledger.events import DeadLetter, Owner, SampleEnvelope
from ledger.fast_build import builder
from ledger.holds import HoldBook
from ledger.idle import GpuIdleState, IdleAlert, IdleObservation, step
from ledger.idle_shares import ShareStep, ended_shares, flag_legs, release_step, share_steps
from ledger.ingest.batch import Folded, FoldRules, booker, refused, sourced
from ledger.ingest.validation import MAX_POSTING_AMOUNT, check_transaction
from ledger.job_owners import (
    ASSIGNMENT_GRACE_US,
    awaited_by,
    gpu_key,
    held_key,
    owner_keys,
    resolve_sample,
)
from ledger.periods import period_label
from ledger.posting_columns import PostingColumns
from ledger.pricing import energy_cost
from ledger.store.port import (
    ConsumedMessage,
    LedgerView,
    SourcedTransaction,
    StateChanges,
    ViewKeys,
)

DecodedSample = tuple[SampleEnvelope, ConsumedMessage]
_observation = builder(IdleObservation)  # `IdleObservation(...)`, fast (`ledger.fast_build`)


@dataclass(frozen=True, slots=True)
class _Observed:
    """A folded sample as the idle detector sees it; `row` is its transaction's index in the
    columns (`columnar`) or in the transaction list."""

    envelope: SampleEnvelope
    columnar: bool
    row: int
    owner: Owner | None
    gpu_ms: int
    cost_micros: int


_observed = builder(_Observed)


def sample_keys(decoded: Sequence[DecodedSample]) -> ViewKeys:
    """What the samples fold reads of the ledger for these samples (one pass over them)."""
    ids: list[str] = []
    gpus: set[str] = set()
    subjects: set[str] = set()
    job_keys: set[str] = set()
    for envelope, _ in decoded:
        ids.append(envelope.id)
        sample = envelope.data
        gpus.add(sample.gpu_uuid)
        subjects.add(envelope.subject)
        owner = sample.owner
        if (owner is not None and owner.team is None) or any(
            p.owner is not None and p.owner.team is None for p in sample.processes
        ):  # a team-less owner (`owner_keys`): rare
            job_keys |= owner_keys(sample)
    return ViewKeys(
        event_ids=ids,
        gpu_uuids=frozenset(gpus | subjects),  # a MIG instance's own timeline too
        subjects=frozenset(subjects),
        scopes=frozenset(sample_scope(g) for g in gpus),
        holds=True,
        job_keys=frozenset(job_keys),
    )


def fold_samples(
    decoded: Sequence[DecodedSample], view: LedgerView, rules: FoldRules, columnar: bool = True
) -> Folded:
    seen = set(view.seen)
    cutoffs = view.forgotten_before
    held_jobs = {job for job, _ in view.holds}
    dead: list[DeadLetter] = []
    transactions: list[SourcedTransaction] = []
    columns = PostingColumns()
    observed: list[_Observed] = []
    shares: list[ShareStep] = []  # of samples split among GPU shares, and released shares
    released: set[tuple[str, str, int]] = set()  # (GPU, job, end) of the ended shares stepped
    by_holders: list[tuple[str, str, int]] = []  # usage a timeline split: awaits its changes
    duplicates = 0
    newest: int | None = None  # of the events new to the ledger: a duplicate moves nothing
    for given, message in decoded:
        envelope = given
        if envelope.id in seen:
            duplicates += 1
            continue
        if cutoffs:  # dedupe time: the end of the interval, as its usage is recorded
            scope = sample_scope(envelope.data.gpu_uuid)
            late = too_late(envelope.data.sample_time_us, scope, cutoffs.get(scope))
            if late is not None:
                dead.append(refused(late, envelope.id, message))
                continue
        seen.add(envelope.id)
        newest = envelope.time_us if newest is None else max(newest, envelope.time_us)
        envelope = resolve_sample(envelope, view.job_owners)
        timeline = assignment_of(view.timelines, envelope)
        if columnar:
            fast = _add_common_case(columns, envelope, message, rules, timeline, held_jobs, view)
            if fast is not None:
                observed.append(fast)
                if timeline:
                    shares.extend(_release(envelope, timeline, (), released))
                continue
        held = held_over(timeline, envelope)
        try:
            usage = attribute_usage(envelope, rules.prices, rules.cost_centres, held, rules.zone)
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
        if timeline:
            shares.extend(_release(envelope, timeline, held, released))
            if usage.by_timeline:
                key = held_key(sample_timeline_key(view.timelines, envelope))
                by_holders.append((key, txn.txn_id, txn.end_us))
        if share_split(envelope.data, held):
            shares.extend(share_steps(envelope, held, txn, len(transactions)))
        else:
            observed.append(
                _Observed(
                    envelope,
                    False,
                    len(transactions),
                    usage.owner or _awaiting_owner(envelope),
                    usage.gpu_ms,
                    usage.cost_micros,
                )
            )
        transactions.extend(sourced([txn], message))
    states, alerts, flagged = detect_idle(observed, view.idle, rules, shares)
    idle_legs: dict[int, set[str]] = {}
    for item in flagged:
        if isinstance(item, ShareStep):
            if item.job_id is not None:
                idle_legs.setdefault(item.row, set()).add(item.job_id)
        elif item.columnar:
            columns.idle.add(item.row)
        else:
            flag = transactions[item.row]
            transactions[item.row] = replace(flag, txn=replace(flag.txn, idle=True))
    for row, jobs in idle_legs.items():
        flag = transactions[row]
        transactions[row] = replace(flag, txn=flag_legs(flag.txn, jobs))
    awaiting = awaiting_usage(transactions, columns)
    if by_holders:
        awaiting = sorted([*awaiting, *by_holders])
    holds = HoldBook(view.holds, booker(view.closed, rules.zone))
    derived = len(transactions)
    for settlement in holds.settle([t.txn for t in transactions]):  # no held job goes columnar
        source = transactions[settlement.last_usage]
        transactions.append(replace(source, txn=settlement.txn))
    if newest is not None:
        transactions.extend(sourced(holds.expire(newest), decoded[-1][1]))
    return Folded(
        transactions=tuple(transactions),
        dead=tuple(dead),
        changes=StateChanges(
            holds=holds.changed(), awaiting=awaiting, forget_awaiting=forget_before(awaiting)
        ),
        idle_states=tuple(states),
        alerts=tuple(alerts),
        duplicates=duplicates,
        derived_from=derived,
        columns=columns if len(columns) else None,
    )


def _add_common_case(
    columns: PostingColumns,
    envelope: SampleEnvelope,
    message: ConsumedMessage,
    rules: FoldRules,
    timeline: tuple[Holding, ...] | None,
    held_jobs: set[str],
    view: LedgerView,
) -> _Observed | None:
    """The sample's usage appended to `columns` when it is the common case; else None (and
    nothing appended): `attribute_usage` then books it."""
    sample = envelope.data
    shares = owner_shares(sample)
    if len(shares) != 1:
        return None
    owner = shares[0][0]
    charged = owner if owner is not None and owner.team is not None else None
    held = held_over(timeline, envelope)
    if held and (charged is None or any(p.share is not None for p in held)):
        return None
    if charged is not None and (charged.job_id or "") in held_jobs:
        return None
    period = period_label(sample.start_us, rules.zone)
    if period in view.closed:
        return None
    prices = rules.prices
    ms = physical_gpu_ms(sample)
    try:
        money = usage_cost(prices, sample, ms)
    except PricingError:
        return None
    energy = sample.energy_delta_mj or 0
    if energy:
        rate = prices.energy_rate_at(sample.pool, sample.start_us)
        if rate is not None:
            money += energy_cost(energy, rate)
    if max(ms, money, energy) > MAX_POSTING_AMOUNT:
        return None
    dims: tuple[str | None, str | None, str | None, str | None, str | None]
    if charged is None:  # nobody, or a job whose owner is not known yet (kept on the legs)
        account = unallocated_account(sample.pool, sample.model)
        user, job = (None, None) if owner is None else (owner.user, owner.job_id)
        dims = (None, None, user, job, None)
    else:
        team = charged.team
        assert team is not None
        account = consumer_account(team, charged.project)
        dims = (team, charged.project, charged.user, charged.job_id, rules.cost_centres.get(team))
    row = columns.add(
        (
            envelope.id,
            sample.gpu_uuid,
            sample.model,
            sample.pool,
            sample.node,
            sample.start_us,
            sample.sample_time_us,
            period,
            sample.util_gpu_pct,
            message.topic,
            message.partition,
            message.offset,
            account,
            capacity_account(sample.pool, sample.model),
            *dims,
            ms,
            money,
            energy,
        )
    )
    return _observed(envelope, True, row, owner, ms, money)  # its job's, if awaiting its owner


def _release(
    envelope: SampleEnvelope,
    timeline: tuple[Holding, ...],
    held: Sequence[OwnedPiece],
    released: set[tuple[str, str, int]],
) -> list[ShareStep]:
    """The release steps of the ended shares of the sample's GPU not stepped yet in this batch
    (`ledger.idle_shares.ended_shares`); marks them stepped in `released`."""
    steps: list[ShareStep] = []
    gpu = envelope.data.gpu_uuid
    for job, end in ended_shares(envelope, timeline, held):
        if (gpu, job, end) not in released:
            released.add((gpu, job, end))
            steps.append(release_step(envelope, job))
    return steps


def _awaiting_owner(envelope: SampleEnvelope) -> Owner | None:
    """The job-only owner a sample charged to nobody names (its usage awaits that job's owner):
    the idle detector sees the GPU held by that job (`ledger.idle.same_holder`)."""
    first = owner_shares(envelope.data)[0][0]
    return first if first is not None and first.job_id else None


def detect_idle(
    observed: list[_Observed],
    stored: Mapping[str, GpuIdleState],
    rules: FoldRules,
    shares: Sequence[ShareStep] = (),
) -> tuple[list[GpuIdleState], list[IdleAlert], list[_Observed | ShareStep]]:
    """Step each GPU subject's idle detector in sample-time order: the new states, the alerts
    raised and the samples (or shares of samples) whose usage is confirmed idle. A GPU the
    scheduler assigned is allocated even when its sample names no owner (its observed owner is
    then the holder). `shares`: the steps of samples split among GPU shares and of released
    shares (`ledger.idle_shares`); a release steps only a detector that still names an owner."""
    if not observed and not shares:
        return [], [], []
    ordered: Sequence[_Observed | ShareStep] = (
        sorted([*observed, *shares], key=_step_order) if shares else _in_sample_order(observed)
    )
    states: dict[str, GpuIdleState] = {}
    alerts: list[IdleAlert] = []
    flagged: list[_Observed | ShareStep] = []
    policy = rules.idle_policy
    for item in ordered:
        if isinstance(item, ShareStep):
            subject = item.obs.subject
            before = states.get(subject) or stored.get(subject)
            if item.release and (before is None or before.owner is None):
                continue
            state, raised, flag = step(before, item.obs, policy)
            states[subject] = state
            alerts.extend(raised)
            if flag:
                flagged.append(item)
            continue
        envelope = item.envelope
        sample = envelope.data
        obs = _observation(  # IdleObservation's fields, in order
            envelope.subject,
            sample.gpu_uuid,
            sample.node,
            sample.pool,
            sample.model,
            item.owner,
            sample.util_gpu_pct,
            sample.start_us,
            sample.sample_time_us,
            item.gpu_ms,
            item.cost_micros,
        )
        before = states.get(envelope.subject) or stored.get(envelope.subject)
        state, raised, flag = step(before, obs, policy)
        states[envelope.subject] = state
        alerts.extend(raised)
        if flag:
            flagged.append(item)
    return list(states.values()), alerts, flagged


def _in_sample_order(observed: list[_Observed]) -> list[_Observed]:
    return sorted(observed, key=lambda o: (o.envelope.subject, o.envelope.time_us))


def _step_order(item: _Observed | ShareStep) -> tuple[str, int]:
    if isinstance(item, ShareStep):
        return item.obs.subject, item.order_us
    return item.envelope.subject, item.envelope.time_us


def assignment_of(
    timelines: Mapping[str, tuple[Holding, ...]], envelope: SampleEnvelope
) -> tuple[Holding, ...] | None:
    """The assignment timeline a sample is judged against: a MIG instance's own (the scheduler
    assigns instances by `<GPU UUID>/gi<id>`, the sample's subject), else its GPU's."""
    own = timelines.get(envelope.subject) if envelope.data.mig is not None else None
    return own or timelines.get(envelope.data.gpu_uuid)


def sample_timeline_key(
    timelines: Mapping[str, tuple[Holding, ...]], envelope: SampleEnvelope
) -> str:
    """The key of the timeline `assignment_of` judges the sample against."""
    subject = envelope.subject
    return (
        subject
        if envelope.data.mig is not None and timelines.get(subject)
        else envelope.data.gpu_uuid
    )


def held_over(timeline: tuple[Holding, ...] | None, envelope: SampleEnvelope) -> list[OwnedPiece]:
    """Who the scheduler says held the sample's GPU over its interval, whole holders' pieces
    then its shares' (`ledger.assignments.shares_over`); empty when nobody."""
    if not timeline:
        return []
    sample = envelope.data
    pieces = owners_over(timeline, sample.start_us, sample.sample_time_us)
    shares = shares_over(timeline, sample.start_us, sample.sample_time_us)
    return [*pieces, *shares] if shares or any(p.owner is not None for p in pieces) else []


def awaiting_usage(
    transactions: Sequence[SourcedTransaction], columns: PostingColumns
) -> list[tuple[str, str, int]]:
    """(key, transaction id, end) of the usage booked awaiting an owner (`ledger.job_owners`),
    sorted: the same whichever path booked it."""
    awaiting = [
        (key, t.txn.txn_id, t.txn.end_us) for t in transactions for key in awaited_by(t.txn)
    ]
    for row in columns.rows:
        if row[14] is None:  # on unallocated: awaits its GPU's assignment, and its job if named
            awaiting.append((gpu_key(row[1]), row[0], row[6]))
            if row[17]:
                awaiting.append((row[17], row[0], row[6]))
    return sorted(awaiting)


def forget_before(awaiting: Sequence[tuple[str, str, int]]) -> dict[str, int]:
    """Per GPU key awaited (`gpu:`: an assignment; `held:`: a change of the timeline that split
    it), the time before which its usage stops awaiting: its newest such usage less
    `ASSIGNMENT_GRACE_US`."""
    newest: dict[str, int] = {}
    for key, _, end in awaiting:
        if key.startswith(("gpu:", "held:")):
            newest[key] = max(newest.get(key, end), end)
    return {key: end - ASSIGNMENT_GRACE_US for key, end in newest.items()}
