"""Job and GPU-assignment events: the vocabulary of the `jobs` topic, and its strict JSON codec.

The scheduler writes these; the ledger reads `GpuAssigned`/`GpuReleased` to know who holds each
GPU, and `explain` reads the job events to say why a job waits or was preempted.

Invariants:
- every dataclass here is frozen, slotted and holds tuples, never lists;
- `JobEnvelope.id` is derived from content (source, subject, type, a per-type discriminator and
  time), so a resend is the same event and duplicates are harmless;
- job events are keyed (subject) by job id, GPU events by GPU UUID;
- decoding is strict: an unknown field, a missing field, a float/bool/string where an integer
  belongs, an unknown enum value or a negative count raises `EventError`; it goes through the
  generic codec (`ledger.envelope`), `JOBS` being this family.

Schemas of job and GPU-assignment event data (every `JobEventType`):
- v1 (current): the fields of the event's dataclass, as orjson writes the dataclass;
  `JobSubmitted` gained optional fields (`idempotency_key`, `requested_by`, `request_digest`,
  `client`) and `JobFailed` too (`idempotency_key`, `requested_by`, `client`), each written
  only when set: a message without them is the same v1 it always was, and decodes with them
  None. `requested_by` (the API token's name: `admin`, `team:<name>`, `<role>:<name>`) and
  `client` (the caller's address) say who made an API submission or cancel, for the audit
  trail. Likewise `JobSpec.models` (a job that accepts several GPU models),
  `JobSpec.topology` (what a gang requires of where its GPUs sit), `JobSpec.mig_profile` and
  `JobSpec.gpu_share` (fractional requests, `ledger.fractional`), `JobStarted.slurm_job_id`
  and `GpuAssigned.share` (a GPU share's per-mille) are written only when set, and
  `JobAdmitted.placement` (why that model was chosen) only when not empty;
- v0: the first scheduler stamped events in milliseconds, `time_ms`, where v1 has `time_us`
  (other times were already in µs); `job_v0_to_v1` upcasts it. The envelope's `time` was in
  µs in both. An upcast event's id is the one its v1 form derives.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any, ClassVar

import orjson

from ledger.envelope import (
    REGISTRY,
    SPEC_VERSION,
    Envelope,
    Family,
    SchemaRegistry,
    decode_envelope,
    decode_one,
    event_id,
    family_to_dict,
)
from ledger.errors import EventError
from ledger.field_decoding import Decoder, object_decoder
from ledger.fractional import SHARE_UNITS, SPEC_ADDED, check_fraction
from ledger.topology import TopologyNeed

MAX_DETAIL = 2048
MAX_GPUS_PER_JOB = 65_536


class JobEventType(StrEnum):
    """The `type` attribute of every event on the `jobs` topic."""

    SUBMITTED = "tally.job.submitted"
    ADMITTED = "tally.job.admitted"
    WAITING = "tally.job.waiting"
    STARTED = "tally.job.started"
    PREEMPTED = "tally.job.preempted"
    RECLAIMED = "tally.job.reclaimed"
    FINISHED = "tally.job.finished"
    FAILED = "tally.job.failed"
    GPU_ASSIGNED = "tally.gpu.assigned"
    GPU_RELEASED = "tally.gpu.released"


class WaitReason(StrEnum):
    """Why a pending job was not admitted in a scheduling cycle."""

    NO_CAPACITY = "no_capacity"  # not enough free GPUs of a matching model right now
    NO_MATCHING_GPUS = "no_matching_gpus"  # the fleet can never fit it (model, pool or size)
    QUOTA_EXHAUSTED = "quota_exhausted"  # nominal in use; borrowing not allowed or at its limit
    COHORT_EXHAUSTED = "cohort_exhausted"  # no unused lendable quota left in the cohort
    QUOTA_LENT = "quota_lent"  # within nominal, but that quota is lent out until reclaimed
    BUDGET_EXHAUSTED = "budget_exhausted"  # balance − open holds < hold, beyond the overdraft
    NO_PRICE = "no_price"  # a money budget applies but no price is known for the GPU model
    TOPOLOGY = "topology_unmet"  # free GPUs enough, but not in the one node/NVLink/rail required
    BEHIND_HEAD = "behind_head"  # strict FIFO: an earlier job waits
    TICK_LIMIT = "tick_limit"  # the tick admitted its cap of jobs; it is looked at next tick
    UNKNOWN_QUEUE = "unknown_queue"  # the job names a queue or team that is not configured
    PREEMPTED = "preempted"  # requeued after preemption
    RETRYING = "retrying"  # requeued after a failure, within the retry limit


class PreemptReason(StrEnum):
    """Why a running job was stopped to make room for another."""

    RECLAIM_LENT_QUOTA = "reclaim_lent_quota"  # a team takes back nominal quota it lent
    HIGHER_PRIORITY = "higher_priority"  # a higher-priority job needs the GPUs
    OVER_BUDGET = "over_budget"  # the job ran over budget, preemptible by anyone
    GPU_UNHEALTHY = "gpu_unhealthy"  # a GPU it holds went unhealthy (`by` names the GPU)


class FailReason(StrEnum):
    """Why a job ended without finishing."""

    EXIT_NONZERO = "exit_nonzero"
    MAX_RUNTIME = "max_runtime_exceeded"
    EXECUTOR_LOST = "executor_lost"
    CANCELLED = "cancelled"


SIGNED: Mapping[str, Any] = {"min": None}  # field metadata: an integer that may be negative
DETAIL: Mapping[str, Any] = {"max_len": MAX_DETAIL, "empty": True}  # free text, may be empty


@dataclass(frozen=True, slots=True)
class JobSpec:
    """What a job asks for. Times are µs; `None` means "the queue's default" or "any".

    Every job is admitted all-or-nothing (a gang): it gets all `gpus` GPUs in one decision or
    none. `span_nodes` says whether those GPUs may lie on several nodes (a multi-node gang) or
    must share one node (a single process).

    GPU models: `model` names the one model a job accepts (None: any); a job that accepts
    several names them all in `models` (sorted, at least two, `model` then None). Read both
    through `accepted_models`. `topology`: what the gang requires of where its GPUs sit
    (`ledger.topology.TopologyNeed`; None: preferences only). At most one of `mig_profile`
    (`gpus` MIG instances of it) and `gpu_share` (per-mille of one GPU) (`ledger.fractional`).
    """

    job_id: str
    team: str
    project: str
    user: str
    queue: str
    gpus: int = field(metadata={"min": 1, "max": MAX_GPUS_PER_JOB})
    submit_us: int
    estimated_runtime_us: int
    max_runtime_us: int | None = None
    model: str | None = None
    pool: str | None = None
    span_nodes: bool = True
    priority: int | None = field(default=None, metadata=SIGNED)
    models: tuple[str, ...] | None = None
    topology: TopologyNeed | None = None
    mig_profile: str | None = field(default=None, metadata={"max_len": 64})
    gpu_share: int | None = field(default=None, metadata={"min": 1, "max": SHARE_UNITS - 1})

    def __post_init__(self) -> None:
        if not (self.job_id and self.team and self.project and self.user and self.queue):
            raise EventError("job: job_id, team, project, user and queue are required")
        check_fraction(self.job_id, self.gpus, self.mig_profile, self.gpu_share)
        if self.models is not None and (
            self.model is not None
            or len(self.models) < 2
            or list(self.models) != sorted(set(self.models))
        ):
            raise EventError(
                f"job {self.job_id}: models holds two or more distinct models, sorted, and "
                "then model is None"
            )
        if not 1 <= self.gpus <= MAX_GPUS_PER_JOB:
            raise EventError(f"job {self.job_id}: gpus must be in [1, {MAX_GPUS_PER_JOB}]")
        if self.estimated_runtime_us < 0 or self.submit_us < 0:
            raise EventError(f"job {self.job_id}: times must not be negative")
        if self.max_runtime_us is not None and self.max_runtime_us <= 0:
            raise EventError(f"job {self.job_id}: max_runtime_us must be positive")

    @property
    def accepted_models(self) -> tuple[str, ...]:
        """The GPU models the job accepts; empty: any model."""
        if self.models is not None:
            return self.models
        return () if self.model is None else (self.model,)


def model_fields(models: tuple[str, ...]) -> dict[str, Any]:
    """`JobSpec` keywords for a job accepting `models` (empty: any): one model goes in `model`,
    as it always did; several, deduplicated and sorted, in `models`."""
    distinct = tuple(sorted(set(models)))
    if len(distinct) == 1:
        return {"model": distinct[0], "models": None}
    return {"model": None, "models": distinct or None}


@dataclass(frozen=True, slots=True)
class JobSubmitted:
    """A job entered its queue. A submission made with an `Idempotency-Key` carries the key,
    who made it (`requested_by`: the token's name, the key's scope) and a digest of the
    request, so a scheduler rebuilt from the topic still answers a repeat with this job. One
    made through the API says who made it and from where (`requested_by`, `client`) with or
    without a key."""

    KIND: ClassVar[JobEventType] = JobEventType.SUBMITTED
    spec: JobSpec
    time_us: int
    idempotency_key: str | None = None
    requested_by: str | None = None
    request_digest: str | None = None
    client: str | None = None

    @property
    def job_id(self) -> str:
        return self.spec.job_id


@dataclass(frozen=True, slots=True)
class JobAdmitted:
    """The scheduler gave a job its GPUs (all of them: admission is all-or-nothing).

    `borrowed_gpus` of them count against cohort members' unused quota; `preemptible` is true
    when the queue allows preemption or the job runs as an over-budget borrower; the hold is
    the expected usage reserved against the team's budget until the job ends. `placement` says
    why this GPU model was chosen when the job accepted more than one (empty otherwise).
    """

    KIND: ClassVar[JobEventType] = JobEventType.ADMITTED
    job_id: str
    team: str
    queue: str
    pool: str
    model: str
    gpu_uuids: tuple[str, ...]
    nodes: tuple[str, ...]
    priority: int = field(metadata=SIGNED)
    borrowed_gpus: int
    preemptible: bool
    hold_micros: int
    hold_gpu_ms: int
    attempt: int
    time_us: int
    over_budget: bool = False
    placement: str = field(default="", metadata=DETAIL)


@dataclass(frozen=True, slots=True)
class JobWaiting:
    KIND: ClassVar[JobEventType] = JobEventType.WAITING
    job_id: str
    reason: WaitReason
    time_us: int
    detail: str = field(default="", metadata=DETAIL)


@dataclass(frozen=True, slots=True)
class JobStarted:
    """The executor started the job's processes on its GPUs; `slurm_job_id`: the Slurm job it
    runs as, under the Slurm executor (what `SLURM_JOB_ID` says in its processes), whose
    `executor_id` (`slurm:<id>`, the job id those processes' owners carry) the ledger takes as
    an alias of the Tally job."""

    KIND: ClassVar[JobEventType] = JobEventType.STARTED
    job_id: str
    time_us: int
    slurm_job_id: str | None = field(default=None, metadata={"max_len": 64})

    @property
    def executor_id(self) -> str | None:
        """The job id the run's processes' owners carry when the executor gave the run one of
        its own (`slurm:<id>`), else None."""
        return f"slurm:{self.slurm_job_id}" if self.slurm_job_id else None


@dataclass(frozen=True, slots=True)
class JobPreempted:
    """A running job was stopped for job `by` (for `gpu_unhealthy`: the GPU's UUID); it goes
    back to its queue with the same attempt number (a preemption is no failed attempt)."""

    KIND: ClassVar[JobEventType] = JobEventType.PREEMPTED
    job_id: str
    by: str
    reason: PreemptReason
    time_us: int
    detail: str = field(default="", metadata=DETAIL)


@dataclass(frozen=True, slots=True)
class JobReclaimed:
    """A job's GPUs were taken back because they sat allocated but idle; it does not requeue."""

    KIND: ClassVar[JobEventType] = JobEventType.RECLAIMED
    job_id: str
    gpu_uuids: tuple[str, ...]
    idle_since_us: int
    time_us: int
    detail: str = field(default="", metadata=DETAIL)


@dataclass(frozen=True, slots=True)
class JobFinished:
    KIND: ClassVar[JobEventType] = JobEventType.FINISHED
    job_id: str
    time_us: int


@dataclass(frozen=True, slots=True)
class JobFailed:
    """A job ended without finishing; `retry` says whether it goes back to its queue. A cancel
    made with an `Idempotency-Key` carries the key; one made through the API says who sent it
    and from where (`requested_by`, `client`)."""

    KIND: ClassVar[JobEventType] = JobEventType.FAILED
    job_id: str
    reason: FailReason
    attempt: int
    retry: bool
    time_us: int
    exit_code: int | None = field(default=None, metadata=SIGNED)
    detail: str = field(default="", metadata=DETAIL)
    idempotency_key: str | None = None
    requested_by: str | None = None
    client: str | None = None


@dataclass(frozen=True, slots=True)
class GpuAssigned:
    """From `time_us` on, GPU `gpu_uuid` is held by `job_id` (keyed by GPU UUID). A GPU share
    (`gpu_uuid` = `<GPU UUID>/share/<job id>`) says its per-mille of the GPU in `share`, which
    the ledger charges the job (`ledger.attribution`); None: the whole GPU or MIG instance."""

    KIND: ClassVar[JobEventType] = JobEventType.GPU_ASSIGNED
    gpu_uuid: str
    node: str
    pool: str
    model: str
    job_id: str
    team: str
    project: str
    user: str
    time_us: int
    share: int | None = field(default=None, metadata={"min": 1, "max": SHARE_UNITS - 1})


@dataclass(frozen=True, slots=True)
class GpuReleased:
    """From `time_us` on, `job_id` no longer holds GPU `gpu_uuid` (keyed by GPU UUID)."""

    KIND: ClassVar[JobEventType] = JobEventType.GPU_RELEASED
    gpu_uuid: str
    node: str
    pool: str
    model: str
    job_id: str
    team: str
    project: str
    user: str
    time_us: int


JobEvent = (
    JobSubmitted
    | JobAdmitted
    | JobWaiting
    | JobStarted
    | JobPreempted
    | JobReclaimed
    | JobFinished
    | JobFailed
    | GpuAssigned
    | GpuReleased
)

EVENT_CLASSES: Mapping[JobEventType, type[JobEvent]] = {
    cls.KIND: cls
    for cls in (
        JobSubmitted,
        JobAdmitted,
        JobWaiting,
        JobStarted,
        JobPreempted,
        JobReclaimed,
        JobFinished,
        JobFailed,
        GpuAssigned,
        GpuReleased,
    )
}

JOB_SCHEMA = 1
CURRENT_JOB_SCHEMA: Mapping[str, int] = {kind: JOB_SCHEMA for kind in JobEventType}

JobEnvelope = Envelope[JobEvent]  # keyed (subject) by job id, GPU events by GPU UUID


def subject_of(event: JobEvent) -> str:
    """The Kafka key: the GPU UUID for GPU events, the job id otherwise."""
    if isinstance(event, GpuAssigned | GpuReleased):
        return event.gpu_uuid
    return event.job_id


def _discriminator(event: JobEvent) -> str:
    """What tells apart two events of one type, subject and time."""
    if isinstance(event, JobWaiting):
        return event.reason.value
    if isinstance(event, JobAdmitted | JobFailed):
        return str(event.attempt)
    if isinstance(event, JobPreempted):
        return event.by
    if isinstance(event, GpuAssigned | GpuReleased):
        return event.job_id
    return ""


def job_event_id(event: JobEvent, source: str) -> str:
    subject = subject_of(event)
    return event_id(source, f"{subject}/{event.KIND.value}/{_discriminator(event)}", event.time_us)


def job_envelope(event: JobEvent, source: str) -> JobEnvelope:
    """Wrap an event in its envelope with its content-derived id."""
    return Envelope(
        id=job_event_id(event, source),
        type=event.KIND,
        source=source,
        subject=subject_of(event),
        time_us=event.time_us,
        schema=CURRENT_JOB_SCHEMA[event.KIND],
        data=event,
    )


# ---------------------------------------------------------------------------- encoding


_FIELD_NAMES: dict[type[Any], tuple[str, ...]] = {}  # a dataclass → its fields' names, in order


def _without(event: Any, *names: str) -> dict[str, Any]:
    """The event's fields but `names`, in order (`fields()` is read once per class: it was
    the largest cost of encoding a job event)."""
    cls = type(event)
    known = _FIELD_NAMES.get(cls)
    if known is None:
        known = _FIELD_NAMES[cls] = tuple(f.name for f in fields(cls))
    return {name: getattr(event, name) for name in known if name not in names}


def _spec_data(spec: JobSpec) -> Any:
    unset = [n for n in SPEC_ADDED if getattr(spec, n) is None]
    return _without(spec, *unset) if unset else spec


_ADDED: Mapping[type[Any], frozenset[str]] = {
    JobSubmitted: frozenset({"idempotency_key", "requested_by", "request_digest", "client"}),
    JobFailed: frozenset({"idempotency_key", "requested_by", "client"}),
    JobStarted: frozenset({"slurm_job_id"}),
    GpuAssigned: frozenset({"share"}),
}  # optional fields added to v1: written only when set


def _as_data(event: JobEvent) -> Any:
    """The event itself: orjson writes a dataclass as its fields in order, tuples as arrays. A
    `JobSubmitted`, `JobFailed`, `JobStarted` or `GpuAssigned` is written without its unset
    added fields, a `JobSpec` without `models` and a `JobAdmitted` with no `placement` without
    those, as before they existed."""
    if isinstance(event, JobSubmitted):
        data = _unset_added_left_out(event, _without(event, "spec"))
        return {"spec": _spec_data(event.spec), **data}
    if isinstance(event, JobAdmitted) and not event.placement:
        return _without(event, "placement")
    if isinstance(event, JobFailed | JobStarted | GpuAssigned):
        return _unset_added_left_out(event, _without(event))
    return event


def _unset_added_left_out(event: Any, data: dict[str, Any]) -> dict[str, Any]:
    added = _ADDED[type(event)]
    return {k: v for k, v in data.items() if v is not None or k not in added}


def job_envelope_to_dict(envelope: JobEnvelope) -> dict[str, Any]:
    return family_to_dict(JOBS, envelope)


def encode_job_event(event: JobEvent, source: str) -> bytes:
    """One `jobs` message value: the event in its envelope (orjson encodes the dataclasses) —
    the object `family_to_dict(JOBS, job_envelope(event, source))` makes, written at once, in
    one `orjson.dumps`, without building and checking an `Envelope` of our own event (the
    scheduler encodes some six events per job)."""
    subject = subject_of(event)
    kind = event.KIND
    name = f"{subject}/{kind.value}/{_discriminator(event)}"
    return orjson.dumps(
        {
            "specversion": SPEC_VERSION,
            "id": event_id(source, name, event.time_us),
            "type": kind.value,
            "source": source,
            "subject": subject,
            "time": event.time_us,
            "schema": CURRENT_JOB_SCHEMA[kind],
            "data": _as_data(event),
        }
    )


# ---------------------------------------------------------------------------- decoding

_DECODERS: Mapping[JobEventType, Decoder] = {
    kind: object_decoder(cls) for kind, cls in EVENT_CLASSES.items()
}


def job_event_from_dict(kind: JobEventType, data: dict[str, Any]) -> JobEvent:
    """Decode and validate the v1 data of an event of `kind`; raises EventError."""
    event: JobEvent = _DECODERS[kind]("data", data)
    return event


def job_v0_to_v1(data: dict[str, Any]) -> dict[str, Any]:
    """v0 job event data → v1: `time_ms` (milliseconds) becomes `time_us`."""
    out = {k: v for k, v in data.items() if k != "time_ms"}
    if "time_ms" in data:
        ms = data["time_ms"]
        out["time_us"] = ms * 1000 if type(ms) is int else ms
    return out


JOBS: Family[JobEvent] = Family(
    name="job",
    kinds={kind.value: kind for kind in JobEventType},
    to_data=_as_data,
    from_data=job_event_from_dict,
    wrap=job_envelope,
    schema=JOB_SCHEMA,
    label="job event type",
    subject_is="job id or GPU UUID",
    time_is="time_us",
)
REGISTRY.add(JOBS, {(kind, 0): job_v0_to_v1 for kind in JobEventType})
JOB_REGISTRY = REGISTRY


def job_envelope_from_dict(obj: Any, registry: SchemaRegistry = REGISTRY) -> JobEnvelope:
    """Decode and validate one envelope, upcasting its data; raises EventError."""
    return decode_envelope(obj, JOBS, registry)


def decode_job_event(value: bytes | str, registry: SchemaRegistry = REGISTRY) -> JobEnvelope:
    """Decode one `jobs` message value; raises EventError for anything invalid."""
    return decode_one(value, JOBS, registry)


def ended_for_good(events: Iterable[JobEnvelope]) -> dict[str, int]:
    """The jobs `events` end for good, each with its end's time: finished, or failed and not
    retried (the scheduler places no hold for them afterwards; preempted, reclaimed and
    retried jobs come back)."""
    return {
        e.data.job_id: e.data.time_us
        for e in events
        if isinstance(e.data, JobFinished) or (isinstance(e.data, JobFailed) and not e.data.retry)
    }
