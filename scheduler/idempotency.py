"""Idempotency keys of submits and cancels: which request a key, per caller, was first used for.

A key is scoped by who sent it (`admin`, `team:<name>`, `<role>:<name>`; `requested_by`): two
callers may use the same key for different requests.

- Submit: the key, its scope and a digest of the request travel in the `JobSubmitted` event, so
  the map is rebuilt with the rest of the state when the scheduler replays the `jobs` topic. The
  same key with the same request finds the job it created; with a different request it is
  refused (`RejectKind.KEY_REUSED`).
- Cancel: the key and its scope travel in the cancel's `JobFailed`; the same key again answers
  with the cancelled job instead of a conflict; used for another job it is refused.

Pure bookkeeping: no I/O, no clock.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, fields

import orjson

from ledger.job_events import FailReason, JobFailed, JobSubmitted
from scheduler.errors import Rejected, RejectKind
from scheduler.records import SubmitRequest

MAX_KEY = 128


_ADDED = frozenset({"topology", "mig_profile", "gpu_share"})  # left out when unset


def request_digest(request: SubmitRequest) -> str:
    """A digest of everything a submission asks for (not its key, nor where it came from). The
    models are written as the single `model` requests were before a job could accept several
    (null, a name, or the sorted names), and `client` and `caller` are left out, as is
    `topology`, `mig_profile` and `gpu_share` when unset, so a key's digest stays what earlier
    builds wrote."""
    models = sorted(set(request.models))
    model: str | list[str] | None = models[0] if len(models) == 1 else (models or None)
    data: dict[str, object] = {}
    for f in fields(request):
        if f.name in ("client", "caller") or (
            f.name in _ADDED and getattr(request, f.name) is None
        ):
            continue
        value = getattr(request, f.name)
        if f.name == "models":
            data["model"] = model
        else:
            data[f.name] = None if f.name == "idempotency_key" else value
    canonical = orjson.dumps(data)
    return hashlib.blake2b(canonical, digest_size=16).hexdigest()


def _shown(key: str) -> str:
    return key if len(key) <= 64 else key[:64] + "…"


@dataclass(slots=True)
class RequestKeys:
    """(scope, key) → the job a submit made (with its request's digest) or a cancel targeted."""

    submits: dict[tuple[str, str], tuple[str, str]] = field(default_factory=dict)
    cancels: dict[tuple[str, str], str] = field(default_factory=dict)

    def saw(self, event: JobSubmitted | JobFailed) -> None:
        """Remember the key of a submission or cancel (as it is applied, or replayed)."""
        if event.idempotency_key is None or event.requested_by is None:
            return
        scope = (event.requested_by, event.idempotency_key)
        if isinstance(event, JobSubmitted):
            self.submits.setdefault(scope, (event.job_id, event.request_digest or ""))
        elif event.reason is FailReason.CANCELLED:
            self.cancels.setdefault(scope, event.job_id)

    def submitted(self, request: SubmitRequest) -> str | None:
        """The job an earlier submission with `request`'s key made, None if there was none;
        raises Rejected(KEY_REUSED) if that key was used for a different request."""
        key = request.idempotency_key
        if key is None:
            return None
        found = self.submits.get((request.requested_by, key))
        if found is None:
            return None
        job_id, digest = found
        if digest != request_digest(request):
            raise Rejected(
                RejectKind.KEY_REUSED,
                f"Idempotency-Key {_shown(key)!r} was used for a different submission (job "
                f"{job_id}); use a new key for a new request",
            )
        return job_id

    def cancelled(self, scope: str, key: str, job_id: str) -> bool:
        """Whether `key` already cancelled `job_id`; raises Rejected(KEY_REUSED) if it
        cancelled another job."""
        earlier = self.cancels.get((scope, key))
        if earlier is None:
            return False
        if earlier != job_id:
            raise Rejected(
                RejectKind.KEY_REUSED,
                f"Idempotency-Key {_shown(key)!r} was used to cancel job {earlier}; use a new "
                "key for a new request",
            )
        return True
