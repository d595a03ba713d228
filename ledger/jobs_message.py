"""Reading a `jobs`-topic message (`decode_jobs_message`): the holds (`ledger.holds`) and the
scheduler's GPU assignments it carries, its bad parts, and the job events among the rest that
the ledger reads (submissions, starts, failures, finishes); every other job event is passed
over."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from ledger.envelope import DECODE_ERRORS, DeadLetter, dead_letter, decode_envelope, parse
from ledger.holds import HOLDS, HoldEnvelope
from ledger.job_events import JOBS, JobEnvelope, JobEventType

_ASSIGNMENT_TYPES = frozenset({JobEventType.GPU_ASSIGNED.value, JobEventType.GPU_RELEASED.value})
_JOB_TYPES = frozenset(kind.value for kind in JobEventType) - _ASSIGNMENT_TYPES
# submissions and cancellations are audited; submissions and starts name a job's owners;
# finishes and failures end a job (`ledger.job_events.ended_for_good`)
_DECODED_TYPES = frozenset(
    {
        JobEventType.SUBMITTED.value,
        JobEventType.FAILED.value,
        JobEventType.STARTED.value,
        JobEventType.FINISHED.value,
    }
)


@dataclass(frozen=True, slots=True)
class JobsMessage:
    """One jobs-topic message as the ledger reads it: its holds, the scheduler's GPU
    assignments (`GpuAssigned` / `GpuReleased`), its bad parts, how many job events it
    carried that are not the ledger's business, and the submissions, starts, failures and
    finishes among them (`audited`: the audit trail records submissions and cancellations, the
    job owners projection reads submissions and starts, a global shard's holds the ends,
    `ended_for_good`; one that does not decode is passed over, never a dead letter)."""

    holds: tuple[HoldEnvelope, ...]
    dead: tuple[DeadLetter, ...]
    ignored: int = 0
    assignments: tuple[JobEnvelope, ...] = ()
    audited: tuple[JobEnvelope, ...] = ()


def decode_jobs_message(value: bytes | None) -> JobsMessage:
    """Decode the holds and GPU assignments in a jobs-topic message (an envelope or an array).
    Never raises."""
    items, refused = parse(value)
    if refused is not None:
        return JobsMessage((), (refused,))
    holds: list[HoldEnvelope] = []
    assignments: list[JobEnvelope] = []
    dead: list[DeadLetter] = []
    audited: list[JobEnvelope] = []
    ignored = 0
    for item in items:
        kind = item.get("type") if type(item) is dict else None
        if type(kind) is not str:
            kind = None  # a list or an object is no type (and cannot be looked up)
        if kind in _JOB_TYPES:
            ignored += 1
            if kind in _DECODED_TYPES:
                with contextlib.suppress(*DECODE_ERRORS):
                    audited.append(decode_envelope(item, JOBS))
            continue
        try:
            if kind in _ASSIGNMENT_TYPES:
                assignments.append(decode_envelope(item, JOBS))
            else:
                holds.append(decode_envelope(item, HOLDS))
        except DECODE_ERRORS as exc:
            dead.append(dead_letter(item, exc))
    return JobsMessage(tuple(holds), tuple(dead), ignored, tuple(assignments), tuple(audited))
