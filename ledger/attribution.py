"""Attribution: turn one GPU sample into one balanced usage transaction.

The physical time of the sample is `interval × slices / total_slices` GPU-milliseconds (a whole
GPU has one slice of one). Owners are found in this order: the sample's own owner (a pod, the
simulated workload), else the owners of its processes, else the scheduler's assignment of the GPU
over the interval (split by how long each job held it, so an owner change mid-interval is
exact), else nobody (unallocated capacity).

GPU shares (`ledger.fractional`, time-sliced): when the scheduler's timeline says jobs held
shares of the sample's GPU over the interval (and the sample itself names no team), each share
job is charged what it held — its per-mille × the time it held it — whatever its processes
used, and the unheld rest goes where an unheld GPU's time goes (unallocated capacity; a whole
holder's time to it). The parts are split by `cumulative_parts`, the rule MIG slices split a
GPU's time by, so they sum exactly to the sample's physical GPU time.

When several owners' processes share a GPU without MIG, the time is split by per-process SM
utilisation; if no process reports any, by used memory; if that is zero too, equally. Processes
with no known owner count towards the unallocated share. Every split uses largest-remainder
rounding, so the integer parts sum exactly to the whole; money is rounded once for the whole
sample (`pricing.cost_of`; per price piece when a price changes inside the interval, see
`usage_cost`) and split the same way. When the sample reports the energy it used
(`energy_delta_mj`), that energy is posted in millijoules, split the same way, and — when the
price book prices energy — its cost (rounded once) is added to the sample's money.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, tzinfo

from ledger.accounts import capacity_account, consumer_account, unallocated_account
from ledger.assignments import OwnedPiece, main_holder
from ledger.events import GpuSample, MigInstance, Owner, SampleEnvelope
from ledger.periods import period_label
from ledger.postings import Posting, Transaction, TransactionKind
from ledger.pricing import PriceBook, cost_of, energy_cost
from ledger.units import SHARE_UNITS, US_PER_MS, Unit, divide_round_half_even


def largest_remainder(total: int, weights: Sequence[int]) -> list[int]:
    """Split `total` into integer parts proportional to `weights` that sum exactly to `total`.

    Ties in the remainders go to the earlier weight, so the split is deterministic.
    """
    if not weights:
        raise ValueError("nothing to split among")
    weight_sum = sum(weights)
    if weight_sum <= 0:
        weights = [1] * len(weights)
        weight_sum = len(weights)
    parts = [total * w // weight_sum for w in weights]
    short = total - sum(parts)
    order = sorted(range(len(weights)), key=lambda i: (-(total * weights[i] % weight_sum), i))
    for i in order[:short]:
        parts[i] += 1
    return parts


def cumulative_parts(total: int, weights: Sequence[int]) -> list[int]:
    """Split `total` into integer parts proportional to `weights` (summing to more than 0) as
    MIG slices split a GPU's time (`physical_gpu_ms`): each part is the total up to its end
    less the total up to its start, each rounded half-even, so the parts sum exactly to
    `total` and each is within 1 of its exact share."""
    whole = sum(weights)
    parts: list[int] = []
    before = reached = 0
    for weight in weights:
        reached += weight
        end = divide_round_half_even(total * reached, whole)
        parts.append(end - before)
        before = end
    return parts


def share_holders(
    held: Sequence[OwnedPiece], start_us: int, end_us: int
) -> list[tuple[Owner | None, int]] | None:
    """Who held the GPU over `[start_us, end_us)` when shares of it were held (None when no
    share was): each share holder weighted by per-mille × µs held, a whole holder by
    `SHARE_UNITS` × µs, and the unheld rest (None) last; one entry per holder, in order."""
    if not any(p.share is not None for p in held):
        return None
    weights: dict[Owner | None, int] = {}
    for piece in held:
        if piece.owner is None:
            continue
        units = SHARE_UNITS if piece.share is None else piece.share
        weights[piece.owner] = weights.get(piece.owner, 0) + units * (piece.end_us - piece.start_us)
    rest = SHARE_UNITS * (end_us - start_us) - sum(weights.values())
    if rest > 0:
        weights[None] = rest
    return list(weights.items())


def share_split(sample: GpuSample, held: Sequence[OwnedPiece]) -> bool:
    """Whether the sample's time is split among the shares of its GPU held over it
    (`share_holders`): a whole GPU's sample that names no team, with a share held over it."""
    if not held or sample.mig is not None or _charged(sample.owner) is not None:
        return False
    return any(p.share is not None for p in held)


UNCONFIGURED_GPU_INSTANCE = 0xFFFF
UNCONFIGURED_PROFILE = "unconfigured"


def unconfigured_slices(instances: Sequence[MigInstance]) -> MigInstance | None:
    """The slices of a MIG-enabled GPU that no instance occupies, as one pseudo-instance.

    Collectors emit a sample for it (no processes, no owner), so a partly carved GPU's idle
    slices land on the unallocated account and the GPU's time is fully accounted for.
    """
    if not instances:
        return None
    total = instances[0].total_slices
    used = sum(m.slices for m in instances)
    if used >= total:
        return None
    return MigInstance(UNCONFIGURED_GPU_INSTANCE, 0, UNCONFIGURED_PROFILE, total - used, total)


def physical_gpu_ms(sample: GpuSample) -> int:
    """GPU-milliseconds the sample's GPU or MIG slice physically existed for.

    A slice whose collector gave its place in the GPU's layout (`MigInstance.first_slice`) gets
    the rounded time up to its last slice less the rounded time up to its first, so the slices
    of one sampling pass sum exactly to the whole GPU's rounded time; without it, its own share
    rounded on its own (within 1 ms of the exact share)."""
    mig = sample.mig
    if mig is None:
        return divide_round_half_even(sample.interval_us, US_PER_MS)
    per_slice = US_PER_MS * mig.total_slices
    if mig.first_slice is not None:
        end = divide_round_half_even(sample.interval_us * (mig.first_slice + mig.slices), per_slice)
        return end - divide_round_half_even(sample.interval_us * mig.first_slice, per_slice)
    return divide_round_half_even(sample.interval_us * mig.slices, per_slice)


def _named(owner: Owner | None) -> Owner | None:
    """`owner` when it names a team or a job (one awaiting its owner), else None."""
    if owner is None or (owner.team is None and not owner.job_id):
        return None
    return owner


def owner_shares(sample: GpuSample) -> list[tuple[Owner | None, int]]:
    """Who held the sample's GPU, with integer weights; `None` stands for unallocated. An owner
    with a job id but no team is its own share (booked to unallocated, awaiting its owner)."""
    if sample.owner is not None and sample.owner.team is not None:
        return [(sample.owner, 1)]
    processes = sample.processes
    if len(processes) == 1:  # the common case: one process, one owner or none
        return [(_named(processes[0].owner), 1)]
    if not processes:
        return [(_named(sample.owner), 1)]
    owned = [p for p in sample.processes if _named(p.owner) is not None]
    if not owned:
        return [(None, 1)]
    by_sm: dict[Owner | None, int] = {}
    by_memory: dict[Owner | None, int] = {}
    for process in sample.processes:
        owner = _named(process.owner)
        by_sm[owner] = by_sm.get(owner, 0) + (process.sm_util_pct or 0)
        by_memory[owner] = by_memory.get(owner, 0) + process.used_memory_bytes
    weights = by_sm if sum(by_sm.values()) > 0 else by_memory
    if sum(weights.values()) == 0:
        weights = {owner: 1 for owner in by_sm}
    # Deterministic order: owned in first-seen order, unallocated last.
    return sorted(weights.items(), key=lambda item: item[0] is None)


def _charged(owner: Owner | None) -> Owner | None:
    """`owner` when usage is charged to it (it names a team), else None."""
    return owner if owner is not None and owner.team is not None else None


def usage_cost(prices: PriceBook, sample: GpuSample, gpu_ms: int) -> int:
    """Money for `gpu_ms` of the sample's interval at the prices in force over it.

    When a price changes inside the interval, the GPU time is split by duration (largest
    remainder) and each part is priced at its own rate; each part is rounded once.
    """
    pieces = prices.rates_between(sample.model, sample.pool, sample.start_us, sample.sample_time_us)
    if len(pieces) == 1:
        return cost_of(gpu_ms, pieces[0][2])
    parts = largest_remainder(gpu_ms, [hi - lo for lo, hi, _ in pieces])
    return sum(cost_of(ms, rate) for ms, (_, _, rate) in zip(parts, pieces, strict=True))


@dataclass(frozen=True, slots=True)
class Usage:
    """A sample's usage transaction and the facts the idle detector reads off it: the first
    owner (None: unallocated), the physical GPU time and the money it cost; `by_timeline`:
    whether the scheduler's assignment timeline split it among its holders (the sample named
    no team, or shares of the GPU were held), so a later change of that timeline moves it."""

    txn: Transaction
    owner: Owner | None
    gpu_ms: int
    cost_micros: int
    by_timeline: bool = False


def attribute_sample(
    envelope: SampleEnvelope,
    prices: PriceBook,
    cost_centres: Mapping[str, str],
    held: Sequence[OwnedPiece] = (),
    zone: tzinfo = UTC,
) -> Transaction:
    """The usage transaction of one sample event. Raises PricingError for an unpriced model."""
    return attribute_usage(envelope, prices, cost_centres, held, zone).txn


def attribute_usage(
    envelope: SampleEnvelope,
    prices: PriceBook,
    cost_centres: Mapping[str, str],
    held: Sequence[OwnedPiece] = (),
    zone: tzinfo = UTC,
) -> Usage:
    """The usage of one sample event, booked into the month (in `zone`, the ledger's time zone)
    in which its interval starts. Raises PricingError for an unpriced model.

    `held` is who the scheduler says held the GPU over the sample's interval; it decides the
    owners only when the sample names none, splitting the time by how long each held it — or
    when it holds shares of the GPU and the sample names no team (`share_holders`).
    """
    sample = envelope.data
    total_ms = physical_gpu_ms(sample)
    total_cost = usage_cost(prices, sample, total_ms)
    energy = sample.energy_delta_mj or 0
    if energy:
        rate = prices.energy_rate_at(sample.pool, sample.start_us)
        if rate is not None:
            total_cost += energy_cost(energy, rate)
    held_shares = None
    by_timeline = False
    if share_split(sample, held):
        held_shares = share_holders(held, sample.start_us, sample.sample_time_us)
    if held_shares is not None:
        shares = held_shares
        ms_parts = cumulative_parts(total_ms, [w for _, w in shares])
        first_owner = main_holder(held)
        by_timeline = True
    else:
        shares = owner_shares(sample)
        first_owner = _charged(shares[0][0])
        if held and all(_charged(owner) is None for owner, _ in shares):
            by_timeline = True
            by_holder: dict[Owner | None, int] = {}
            for piece in held:
                span = piece.end_us - piece.start_us
                by_holder[piece.owner] = by_holder.get(piece.owner, 0) + span
            shares = sorted(by_holder.items(), key=lambda item: item[0] is None)
        weights = [w for _, w in shares]
        ms_parts = largest_remainder(total_ms, weights) if len(shares) > 1 else [total_ms]
    cost_parts = largest_remainder(total_cost, ms_parts) if len(shares) > 1 else [total_cost]
    energy_parts = largest_remainder(energy, ms_parts) if len(shares) > 1 else [energy]
    postings: list[Posting] = []
    for (owner, _), ms, cost, mj in zip(shares, ms_parts, cost_parts, energy_parts, strict=True):
        if owner is None or owner.team is None:
            account = unallocated_account(sample.pool, sample.model)
            user, job = (None, None) if owner is None else (owner.user, owner.job_id)
            postings.append(Posting(account, Unit.GPU_MS, ms, None, None, user, job))
            postings.append(Posting(account, Unit.MONEY, cost, None, None, user, job))
            if energy:
                postings.append(Posting(account, Unit.ENERGY_MJ, mj, None, None, user, job))
            continue
        account = consumer_account(owner.team, owner.project)
        centre = cost_centres.get(owner.team)
        postings.append(
            Posting(
                account,
                Unit.GPU_MS,
                ms,
                owner.team,
                owner.project,
                owner.user,
                owner.job_id,
                centre,
            )
        )
        postings.append(
            Posting(
                account,
                Unit.MONEY,
                cost,
                owner.team,
                owner.project,
                owner.user,
                owner.job_id,
                centre,
            )
        )
        if energy:
            postings.append(
                Posting(
                    account,
                    Unit.ENERGY_MJ,
                    mj,
                    owner.team,
                    owner.project,
                    owner.user,
                    owner.job_id,
                    centre,
                )
            )
    capacity = capacity_account(sample.pool, sample.model)
    postings.append(Posting(capacity, Unit.GPU_MS, -total_ms))
    postings.append(Posting(capacity, Unit.MONEY, -total_cost))
    if energy:
        postings.append(Posting(capacity, Unit.ENERGY_MJ, -energy))
    txn = Transaction(
        txn_id=envelope.id,
        kind=TransactionKind.USAGE,
        start_us=sample.start_us,
        end_us=sample.sample_time_us,
        gpu_uuid=sample.gpu_uuid,
        model=sample.model,
        pool=sample.pool,
        node=sample.node,
        postings=tuple(postings),
        cause=(envelope.id,),
        period=period_label(sample.start_us, zone),
        util_pct=sample.util_gpu_pct,
    )
    if first_owner is None and held:
        first_owner = main_holder(held)
    return Usage(txn, first_owner, total_ms, total_cost, by_timeline)
