"""Job identity learned from the jobs topic: who owns a Tally job, and owners known only late.

A process whose owner carries only a job id (`TALLY_JOB_ID=<tally job id>` from Tally's
executors, or `slurm:<id>` of a job Tally submitted through Slurm) names no team. The ledger
learns job → owner from the jobs topic it consumes (`learned_owners`): a `JobSubmitted` names
the job's team, project and user, a `GpuAssigned` too, and a `JobStarted` whose executor gave
the run an id of its own (`executor_id`, e.g. `slurm:123`) makes that id an alias of the Tally
job. The first owner learned for a key stays (a later event never rewrites it); an alias whose
Tally job is not known yet is passed over.

`resolve_sample` fills a team-less owner (the sample's or a process's) from that projection:
the projection's fields win, the collector's fill what it leaves unset (the precedence of
`collectors.ownership`), and the job id becomes the Tally job's, so holds settle against it.

A sample whose job is not known yet is booked to `unallocated:<pool>/<model>` with its user and
job id kept on the postings (the suspense: visible in `tally report cost --by job_id
--include-unallocated`), and the ledger remembers which transactions await which job key. When
the job's owner becomes known, `correction` gives the reversal of each such transaction and its
re-posting, the awaiting legs moved to `consumer:<team>/<project>` with the owner's dimensions
(append-only, each balanced, ids derived from the corrected transaction's).

Usage charged to nobody also awaits its GPU's key (`gpu_key`): when a `GpuAssigned` covering it
is folded after it, `reassigned` gives its reversal and a re-posting split among the holders as
`attribution.attribute_usage` splits a sample the assignment timeline attributes. It awaits for
`ASSIGNMENT_GRACE_US` before its GPU's newest such usage, then stays as booked.

Usage the timeline itself split among its holders (the sample named no team, or shares of the
GPU were held: `attribution.Usage.by_timeline`) awaits that timeline's key (`held_key`: the GPU,
MIG instance, or the GPU the shares are of) for the same `ASSIGNMENT_GRACE_US`: the scheduler
publishes a `GpuReleased` as it decides it, and the worker may fold the sample whose interval
spans the release first, which then charged the whole interval to the released job. When a
later `GpuReleased` or `GpuAssigned` changes that timeline over such usage's interval,
`retimed` gives its reversal and a re-posting split as the changed timeline splits it (the
released job up to its release, whoever holds the GPU — or nobody, on unallocated — after), so
the ledger books what it books when the jobs were folded first, whatever the order; ids derive
from the corrected transaction's and the changing event's, and a re-posting awaits the
timeline's later changes in turn. Usage ending more than `ASSIGNMENT_GRACE_US` before its
timeline's newest such usage (sealed or not: the awaiting transactions are read through the
store, hot rows and segments alike) stays as booked: a release folded that late is not
corrected.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from ledger.accounts import AccountKind, consumer_account, unallocated_account
from ledger.assignments import OwnedPiece
from ledger.attribution import cumulative_parts, largest_remainder, share_holders
from ledger.envelope import event_id
from ledger.events import GpuSample, Owner, SampleEnvelope
from ledger.job_events import GpuAssigned, JobEnvelope, JobStarted, JobSubmitted
from ledger.postings import Posting, Transaction, TransactionKind
from ledger.units import Unit

IDENTITY_SOURCE = "tally://ledger/identity"
_UNALLOCATED = f"{AccountKind.UNALLOCATED}:"
_CAPACITY = f"{AccountKind.CAPACITY}:"
# How long unallocated usage of a GPU awaits an assignment covering it, before its GPU's newest
# such usage: a `GpuAssigned` consumed after samples it covers is corrected within this window.
ASSIGNMENT_GRACE_US = 15 * 60 * 1_000_000


def awaiting_key(owner: Owner | None) -> str | None:
    """The job key of an owner that names a job but no team (None for any other)."""
    if owner is None or owner.team is not None or not owner.job_id:
        return None
    return owner.job_id


def learned_owners(
    envelopes: Iterable[JobEnvelope], known: Mapping[str, Owner]
) -> dict[str, Owner]:
    """The job keys the events make known, each with its owner, in event order; keys in
    `known` (and keys learned earlier in `envelopes`) are left as they are."""
    new: dict[str, Owner] = {}
    for envelope in envelopes:
        event = envelope.data
        key: str | None = None
        owner: Owner | None = None
        if isinstance(event, JobSubmitted):
            spec = event.spec
            key, owner = spec.job_id, Owner(spec.team, spec.project, spec.user, spec.job_id)
        elif isinstance(event, GpuAssigned):
            key, owner = event.job_id, Owner(event.team, event.project, event.user, event.job_id)
        elif isinstance(event, JobStarted) and event.executor_id:
            key = event.executor_id
            owner = new.get(event.job_id) or known.get(event.job_id)
        if key is not None and owner is not None and key not in known and key not in new:
            new[key] = owner
    return new


def resolve_owner(owner: Owner | None, known: Mapping[str, Owner]) -> Owner | None:
    """`owner` completed from the owner its job key is known by (unchanged when none)."""
    key = awaiting_key(owner)
    found = None if key is None else known.get(key)
    if owner is None or found is None:
        return owner
    return Owner(
        found.team,
        found.project or owner.project,
        found.user or owner.user,
        found.job_id or owner.job_id,
    )


def owner_keys(sample: GpuSample) -> set[str]:
    """The job keys of the sample's team-less owners (its own and its processes')."""
    keys = {awaiting_key(sample.owner)} | {awaiting_key(p.owner) for p in sample.processes}
    return {k for k in keys if k is not None}


def resolve_sample(envelope: SampleEnvelope, known: Mapping[str, Owner]) -> SampleEnvelope:
    """The envelope with each team-less owner whose job is known completed (same id)."""
    sample = envelope.data
    if not known or not (owner_keys(sample) & known.keys()):
        return envelope
    processes = tuple(replace(p, owner=resolve_owner(p.owner, known)) for p in sample.processes)
    data = replace(sample, owner=resolve_owner(sample.owner, known), processes=processes)
    return replace(envelope, data=data)


def gpu_key(gpu_uuid: str) -> str:
    """The key unallocated usage of a GPU awaits a scheduler assignment under."""
    return f"gpu:{gpu_uuid}"


def held_key(timeline_key: str) -> str:
    """The key usage an assignment timeline split among its holders awaits a change of that
    timeline under (a `GpuReleased` or `GpuAssigned` folded after it): the timeline's GPU, MIG
    instance or, for shares, the GPU they are shares of."""
    return f"held:{timeline_key}"


def awaited_by(txn: Transaction) -> list[str]:
    """The keys `txn` awaits an owner under, sorted: the job key of each suspense leg, and its
    GPU's key when it is usage charged to nobody (an assignment covering it would take it)."""
    keys = {p.job_id for p in txn.postings if p.job_id and _suspense(p)}
    held = [p for p in txn.postings if not p.account.startswith(_CAPACITY)]
    if txn.kind is TransactionKind.USAGE and held and all(_suspense(p) for p in held):
        keys.add(gpu_key(txn.gpu_uuid))
    return sorted(keys)


def _suspense(posting: Posting) -> bool:
    return posting.account.startswith(_UNALLOCATED) and posting.team is None


def correction(
    original: Transaction,
    known: Mapping[str, Owner],
    cost_centres: Mapping[str, str],
    cause: str,
    period: str,
) -> tuple[Transaction, Transaction] | None:
    """The reversal of `original` and its re-posting with each suspense leg whose job is in
    `known` moved to the owner's consumer account; None when no leg's job is known. Both are
    booked into `period`, caused (as an admin reversal is) by the event that made the owner
    known and by `original`."""
    legs: list[Posting] = []
    moved = False
    for p in original.postings:
        owner = known.get(p.job_id or "") if p.team is None and _suspense(p) else None
        if owner is None or owner.team is None:
            legs.append(p)
            continue
        moved = True
        legs.append(
            Posting(
                consumer_account(owner.team, owner.project),
                p.unit,
                p.amount,
                owner.team,
                owner.project,
                owner.user or p.user,
                owner.job_id or p.job_id,
                cost_centres.get(owner.team),
            )
        )
    if not moved:
        return None
    return _corrected(original, legs, cause, period)


def reassigned(
    original: Transaction,
    pieces: Sequence[OwnedPiece],
    cost_centres: Mapping[str, str],
    cause: str,
    period: str,
) -> tuple[Transaction, Transaction] | None:
    """The reversal of unallocated usage `original` and its re-posting to whoever `pieces` (the
    scheduler's assignment timeline over its interval) says held the GPU, split as
    `attribution.attribute_usage` splits it; None when nobody held it or `original` is charged."""
    if not any(p.owner is not None for p in pieces):
        return None
    held = [p for p in original.postings if not p.account.startswith(_CAPACITY)]
    if not held or not all(_suspense(p) for p in held):
        return None
    return _corrected(original, timeline_legs(original, pieces, cost_centres), cause, period)


def retimed(
    original: Transaction,
    pieces: Sequence[OwnedPiece],
    cost_centres: Mapping[str, str],
    cause: str,
    period: str,
) -> tuple[Transaction, Transaction] | None:
    """The reversal of usage `original` that the GPU's assignment timeline split among its
    holders (`attribute_usage`: the sample named no team) and its re-posting split as `pieces`
    (the timeline over its interval as a later `GpuReleased` or `GpuAssigned` left it) says;
    None when that split books every holder what it was booked. Ids derive from `original`'s
    and `cause`'s (the event that changed the timeline), so each change corrects once. The
    idle flags stay the detector's (`original`'s: a job's idle share legs stay idle)."""
    legs = timeline_legs(original, pieces, cost_centres)
    if _booked(legs) == _booked(original.postings):
        return None
    idle = {p.job_id for p in original.postings if p.idle and p.job_id}  # a share's idle legs
    if idle:
        legs = [replace(p, idle=True) if p.job_id in idle else p for p in legs]
    return _corrected(original, legs, cause, period, f"{cause}/")


def _booked(postings: Sequence[Posting]) -> list[tuple[str, str, int, str | None]]:
    """What `postings` book to whom, in a comparable form (capacity legs and flags left out)."""
    return sorted(
        (p.account, p.unit.value, p.amount, p.job_id)
        for p in postings
        if not p.account.startswith(_CAPACITY)
    )


def timeline_legs(
    original: Transaction, pieces: Sequence[OwnedPiece], cost_centres: Mapping[str, str]
) -> list[Posting]:
    """`original`'s usage (its capacity legs' totals) split among whoever `pieces` says held
    the GPU, as `attribution.attribute_usage` splits a sample the timeline attributes (shares
    by per-mille × time held, cumulative rounding; whole holders by time held, largest
    remainder, nobody last on unallocated), then its capacity legs unchanged."""
    capacity = [p for p in original.postings if p.account.startswith(_CAPACITY)]
    totals = {p.unit: -p.amount for p in capacity}
    held_shares = share_holders(pieces, original.start_us, original.end_us)
    if held_shares is not None:  # shares of the GPU: each charged what it held
        shares = held_shares
        ms_parts = cumulative_parts(totals.get(Unit.GPU_MS, 0), [w for _, w in shares])
    else:
        by_holder: dict[Owner | None, int] = {}
        for piece in pieces:
            span = piece.end_us - piece.start_us
            by_holder[piece.owner] = by_holder.get(piece.owner, 0) + span
        shares = sorted(by_holder.items(), key=lambda item: item[0] is None)
        ms_parts = largest_remainder(totals.get(Unit.GPU_MS, 0), [w for _, w in shares])
    parts = {Unit.GPU_MS: ms_parts}
    for unit in (Unit.MONEY, Unit.ENERGY_MJ):
        if unit in totals:
            parts[unit] = largest_remainder(totals[unit], ms_parts)
    suspense = unallocated_account(original.pool, original.model)
    legs: list[Posting] = []
    for index, (owner, _) in enumerate(shares):
        for unit, split in parts.items():
            if owner is None or owner.team is None:
                legs.append(Posting(suspense, unit, split[index]))
                continue
            centre = cost_centres.get(owner.team)
            account = consumer_account(owner.team, owner.project)
            legs.append(
                Posting(
                    account,
                    unit,
                    split[index],
                    owner.team,
                    owner.project,
                    owner.user,
                    owner.job_id,
                    centre,
                )
            )
    return [*legs, *capacity]


def _corrected(
    original: Transaction, legs: Sequence[Posting], cause: str, period: str, salt: str = ""
) -> tuple[Transaction, Transaction]:
    """The reversal of `original` and its re-posting as `legs` (ids from `original`'s, and
    `salt`)."""
    reversal = replace(
        original,
        txn_id=event_id(IDENTITY_SOURCE, f"{salt}{original.txn_id}/reversal", 0),
        kind=TransactionKind.REVERSAL,
        postings=tuple(replace(p, amount=-p.amount) for p in original.postings),
        cause=(cause, original.txn_id),
        period=period,
    )
    repost = replace(
        original,
        txn_id=event_id(IDENTITY_SOURCE, f"{salt}{original.txn_id}/repost", 0),
        kind=TransactionKind.USAGE,
        postings=tuple(legs),
        cause=(cause, original.txn_id),
        period=period,
    )
    return reversal, repost
