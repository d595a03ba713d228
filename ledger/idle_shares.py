"""Idle detection per GPU share: each job's share of a time-sliced GPU is its own idle-detector
subject, `<GPU UUID>/share/<job id>` (`ledger.fractional.share_key`), stepped by the same
state machine, policy and grace period as a whole GPU (`ledger.idle.step`).

Rules (the samples fold, `ledger.ingest.samples`, applies them):
- a sample whose usage was split among the shares held over it (`ledger.attribution.share_split`:
  no MIG, no team named by the sample, a share in the GPU's timeline over the interval) steps
  one detector per share job held over it (`share_steps`), observed over the part of the
  interval the job held its share, owned by the job, and charged what the sample charged the
  job's legs (its waste when idle);
- a share's utilisation is its own processes' on that GPU (`share_util`): the SM utilisation its
  job's processes report, summed (at most 100). A share whose job has no process on the GPU in
  the sample is idle for that sample (0 %). When no process of the sample reports SM
  utilisation at all, a share with a process gets the GPU's utilisation (the driver does not
  tell them apart);
- a sample from a source that reports no processes (`NO_PROCESS_SOURCES`: dcgm-exporter's
  metrics are per GPU) says nothing of any share's own use: each share held over it is busy
  exactly when the GPU is (its utilisation is the GPU's), so a share seen only through dcgm is
  never flagged idle while its GPU works — at worst an idle share beside a busy one goes
  unflagged (never a false idle flag); when the GPU idles, every share on it does;
- a process may name its job only by an executor alias the ledger has not learned yet
  (`slurm:<id>` before its job's `JobStarted` is folded: a collector that reads the process's
  cgroup, not its environment), so it belongs to no share the sample is split among
  (`unresolved`). A share with no process of its own on a GPU where such processes run may be
  their job: its utilisation is then the busiest such alias's (`share_util`'s `unresolved`),
  the most it can be using. So a share held by a Slurm job is stepped from the first sample
  after its assignment, before the alias is known: idle when no process it may own is busy
  (none at all, or only idle ones), busy when exactly one unknown alias is busy and it is the
  only share without processes (then the alias is its). The boundary: with two or more such
  shares on one GPU and a busy unknown alias, which share is busy cannot be told until the
  aliases are learned, so none of them is stepped idle meanwhile (never a false idle flag);
- confirmed-idle flags only that share's legs (`Posting.idle`, `flag_legs`), never the
  transaction: the other shares of the sample may be busy. The GPU's own subject is stepped as
  held by its whole holder over the sample (none while only shares hold it), so an alert open
  on it from a whole-GPU holding resolves (`released`) once shares hold the GPU;
- a share whose holding ended before a sample of its GPU, with none of its job's holdings over
  the sample, is stepped by that sample without an owner (`ended_shares`, `release_step`; once
  per holding and batch, at its first such sample): an alert open on it resolves (`released`)
  as a whole GPU's does when its holder leaves. Such a step only ever changes a share whose
  detector still names an owner;
- the fold's view loads the detector states of every share its GPUs' timelines remember
  (`share_subjects`), so such a release finds the state of a share no sample names.

Exactness is untouched: the detector only flags postings; what each share is charged (and the
GPU's parts summing to its physical time) is attribution's (`ledger.attribution`).

Pure: values in, values out.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace

from ledger.assignments import Holding, OwnedPiece, main_holder
from ledger.events import GpuSample, Owner, ProcessUsage, SampleEnvelope, SampleSource
from ledger.fractional import share_key
from ledger.idle import IdleObservation
from ledger.job_owners import awaiting_key
from ledger.postings import Transaction
from ledger.units import Unit


@dataclass(frozen=True, slots=True)
class ShareStep:
    """One step of a detector in a sample split among shares: the observation, the envelope's
    time (the fold's order), and where a confirmed-idle flag goes — the job whose legs of the
    transaction at `row` are flagged (None: never flagged). `release`: the share's holding ended
    before the sample (the step only closes an episode its detector still has open)."""

    obs: IdleObservation
    order_us: int
    row: int
    job_id: str | None
    release: bool = False


# collectors whose samples never list processes: a share's use cannot be told from its GPU's
NO_PROCESS_SOURCES = frozenset({SampleSource.DCGM})


def share_util(sample: GpuSample, job_id: str, unresolved: Collection[str] = ()) -> int:
    """The utilisation of the sample's GPU by the share job's own processes; with none, the
    busiest of the `unresolved` aliases' (processes it may own, see the module), else 0. A
    sample of a source that lists no processes (`NO_PROCESS_SOURCES`): the GPU's."""
    if sample.source in NO_PROCESS_SOURCES and not sample.processes:
        return sample.util_gpu_pct
    mine = [p for p in sample.processes if p.owner is not None and p.owner.job_id == job_id]
    if mine:
        return _util(sample, mine)
    return max(
        (
            _util(sample, [p for p in sample.processes if _job_of(p) == alias])
            for alias in unresolved
        ),
        default=0,
    )


def unresolved(sample: GpuSample, held_jobs: Collection[str]) -> frozenset[str]:
    """The job keys the sample's processes name with no team and no holding over the sample:
    executor aliases (`slurm:<id>`) of jobs the ledger has not tied to a Tally job yet."""
    return frozenset(
        key
        for p in sample.processes
        if (key := awaiting_key(p.owner)) is not None and key not in held_jobs
    )


def _job_of(process: ProcessUsage) -> str | None:
    return None if process.owner is None else process.owner.job_id


def _util(sample: GpuSample, processes: Sequence[ProcessUsage]) -> int:
    if all(p.sm_util_pct is None for p in sample.processes):
        return sample.util_gpu_pct
    return min(100, sum(p.sm_util_pct or 0 for p in processes))


def charged_to(txn: Transaction, job_id: str) -> tuple[int, int]:
    """(GPU-ms, money) the transaction charged the job's consumer legs."""
    ms = money = 0
    for p in txn.postings:
        if p.job_id == job_id and p.team is not None:
            if p.unit is Unit.GPU_MS:
                ms += p.amount
            elif p.unit is Unit.MONEY:
                money += p.amount
    return ms, money


def share_steps(
    envelope: SampleEnvelope, held: Sequence[OwnedPiece], txn: Transaction, row: int
) -> list[ShareStep]:
    """The detector steps of a sample split among shares (`attribution.share_split`): its GPU's
    own subject, held by its whole holder (if any), and one per share job held over it."""
    sample = envelope.data
    whole = [p for p in held if p.share is None]
    holder = main_holder(whole)
    ms, money = (0, 0) if holder is None else charged_to(txn, holder.job_id or "")
    steps = [
        ShareStep(
            _observed(sample, envelope.subject, holder, sample.util_gpu_pct, ms, money),
            envelope.time_us,
            row,
            None if holder is None else holder.job_id,
        )
    ]
    spans: dict[str, tuple[Owner, int, int]] = {}
    for piece in held:
        owner = piece.owner
        if piece.share is None or owner is None or owner.job_id is None:
            continue
        first = spans.get(owner.job_id)
        start = piece.start_us if first is None else min(first[1], piece.start_us)
        end = piece.end_us if first is None else max(first[2], piece.end_us)
        spans[owner.job_id] = (owner if first is None else first[0], start, end)
    held_jobs = {p.owner.job_id for p in held if p.owner is not None and p.owner.job_id}
    aliases = unresolved(sample, held_jobs)
    for job_id, (owner, start, end) in spans.items():
        ms, money = charged_to(txn, job_id)
        util = share_util(sample, job_id, aliases)
        obs = _observed(sample, share_key(sample.gpu_uuid, job_id), owner, util, ms, money)
        steps.append(
            ShareStep(replace(obs, start_us=start, end_us=end), envelope.time_us, row, job_id)
        )
    return steps


def ended_shares(
    envelope: SampleEnvelope, timeline: Sequence[Holding] | None, held: Sequence[OwnedPiece]
) -> list[tuple[str, int]]:
    """(job id, end) of each share holding of the sample's GPU that ended before the sample,
    whose job holds no share over it (`held`), sorted."""
    if not timeline or envelope.data.mig is not None:
        return []
    start = envelope.data.start_us
    ended = {
        (h.owner.job_id, h.to_us)
        for h in timeline
        if h.share is not None and h.to_us is not None and h.to_us <= start and h.owner.job_id
    }
    if not ended:
        return []
    holding_now = {p.owner.job_id for p in held if p.share is not None and p.owner is not None}
    return sorted((job, end) for job, end in ended if job not in holding_now)


def release_step(envelope: SampleEnvelope, job_id: str) -> ShareStep:
    """The ownerless step, at this sample, of the job's ended share of the sample's GPU."""
    sample = envelope.data
    obs = _observed(sample, share_key(sample.gpu_uuid, job_id), None, 0, 0, 0)
    return ShareStep(obs, envelope.time_us, -1, None, release=True)


def flag_legs(txn: Transaction, jobs: Collection[str]) -> Transaction:
    """`txn` with the consumer legs of `jobs` flagged allocated-but-idle."""
    return replace(
        txn,
        postings=tuple(
            replace(p, idle=True) if p.job_id in jobs and p.team is not None else p
            for p in txn.postings
        ),
    )


def share_subjects(
    timelines: Mapping[str, tuple[Holding, ...]], gpus: Collection[str]
) -> frozenset[str]:
    """The detector subjects of the shares the timelines of `gpus` remember."""
    return frozenset(
        share_key(gpu, h.owner.job_id)
        for gpu in gpus
        for h in timelines.get(gpu, ())
        if h.share is not None and h.owner.job_id
    )


def _observed(
    sample: GpuSample,
    subject: str,
    owner: Owner | None,
    util_pct: int,
    gpu_ms: int,
    cost_micros: int,
) -> IdleObservation:
    return IdleObservation(
        subject=subject,
        gpu_uuid=sample.gpu_uuid,
        node=sample.node,
        pool=sample.pool,
        model=sample.model,
        owner=owner,
        util_pct=util_pct,
        start_us=sample.start_us,
        end_us=sample.sample_time_us,
        gpu_ms=gpu_ms,
        cost_micros=cost_micros,
    )
