"""What a submission must satisfy before it becomes a job (`submitted`): names the
configuration knows (team, queue, the team's project, GPU models, pool), at least one of the
GPU models it names allowed by its queue's model policy (those the policy forbids are kept in
the spec and dropped by every cycle, which says so), a priority within its queue's bounds when
a team's token asks, a GPU share only in a dev or inference queue, and a valid `JobSpec` —
then the `JobSubmitted` that makes it a job, with the request's idempotency key
(`scheduler.idempotency`).

Pure: the state, projects, bounds, job id and time are passed in; refusals are `Rejected`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ledger.errors import EventError
from ledger.job_events import JobSpec, JobSubmitted, model_fields
from ledger.topology import TopologyNeed
from scheduler.errors import Rejected, RejectKind
from scheduler.fractional import base_models, share_allowed
from scheduler.idempotency import request_digest
from scheduler.model_choice import forbidden_detail, split_by_queue
from scheduler.records import PriorityBounds, SubmitRequest
from scheduler.state import SchedulerState


def check_names(
    request: SubmitRequest,
    state: SchedulerState,
    projects: Mapping[str, Sequence[str]],
    bounds: Mapping[str, PriorityBounds],
) -> None:
    """Raise Rejected (UNKNOWN, FORBIDDEN) unless the request names what is configured and,
    from a team's token, asks for a priority within its queue's bounds."""
    if request.team not in state.quotas.teams:
        raise Rejected(RejectKind.UNKNOWN, f"unknown team {request.team!r}")
    if request.queue not in state.queues:
        known = ", ".join(sorted(state.queues)) or "none configured"
        raise Rejected(RejectKind.UNKNOWN, f"unknown queue {request.queue!r} ({known})")
    allowed = projects.get(request.team)
    if allowed is not None and request.project not in allowed:
        raise Rejected(
            RejectKind.UNKNOWN,
            f"team {request.team} has no project {request.project!r} ({', '.join(allowed)})",
        )
    # the fleet's models and pools, reported by a collector, placeable now or not (looked at
    # only for a request that names some: most name neither)
    if request.models:
        models = base_models(f.model for f in state.known_flavors())
        for model in request.models:
            if model not in models:
                raise Rejected(RejectKind.UNKNOWN, f"no GPUs of model {model!r} in the fleet")
    queue = state.queues[request.queue]
    if request.gpu_share is not None and not share_allowed(queue):
        raise Rejected(
            RejectKind.UNKNOWN,  # as a model the queue's policy forbids: 422
            f"queue {queue.name} is a {queue.queue_class.value} queue: GPU shares are for dev "
            "and inference queues",
        )
    kept, dropped = split_by_queue(request.models, queue)
    if request.models and not kept:
        raise Rejected(
            RejectKind.UNKNOWN,
            f"{forbidden_detail(dropped, queue)}, which leaves no model this job accepts",
        )
    if request.pool is not None and request.pool not in {f.pool for f in state.known_flavors()}:
        raise Rejected(RejectKind.UNKNOWN, f"no pool {request.pool!r} in the fleet")
    queue_bounds = bounds.get(request.queue)
    refusal = None if queue_bounds is None else queue_bounds.refusal(request)
    if refusal is not None:
        raise Rejected(RejectKind.FORBIDDEN, refusal)


def submitted(
    request: SubmitRequest,
    state: SchedulerState,
    job_id: str,
    now_us: int,
    default_estimate_us: int,
) -> JobSubmitted:
    """The event that makes a checked request job `job_id`; an estimate left out is the
    default, capped by the job's and its queue's runtime limits."""
    estimate = request.estimated_runtime_us
    if estimate is None:
        queue = state.queues[request.queue]
        limits = [v for v in (request.max_runtime_us, queue.max_runtime_us) if v is not None]
        estimate = min([default_estimate_us, *limits])
    try:
        spec = JobSpec(
            job_id=job_id,
            team=request.team,
            project=request.project,
            user=request.user,
            queue=request.queue,
            gpus=request.gpus,
            submit_us=now_us,
            estimated_runtime_us=estimate,
            max_runtime_us=request.max_runtime_us,
            **model_fields(request.models),
            pool=request.pool,
            span_nodes=request.span_nodes and request.topology is not TopologyNeed.NODE,
            priority=request.priority,
            topology=request.topology,
            mig_profile=request.mig_profile,
            gpu_share=request.gpu_share,
        )
    except EventError as exc:
        raise Rejected(RejectKind.INVALID, str(exc)) from None
    key = request.idempotency_key
    via_api = key is not None or request.client is not None
    return JobSubmitted(
        spec=spec,
        time_us=now_us,
        idempotency_key=key,
        requested_by=request.requested_by if via_api else None,
        request_digest=None if key is None else request_digest(request),
        client=request.client,
    )
