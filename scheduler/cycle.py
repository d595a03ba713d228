"""The scheduling cycle: seven numbered phases, every decision a pure function of a snapshot.

1. heads     — the first `heads_per_queue` jobs of every (team, queue) backlog
               (`scheduler.snapshot.heads`, called by the state when it takes the snapshot);
2. snapshot  — the immutable `ClusterSnapshot` those heads are judged against;
3. nominate  — unknown queues/teams and jobs the fleet can never hold wait at once; the rest
               get their candidate flavors (`scheduler.admission.nominate`);
4. order     — priority, then fair share, then age (`scheduler.ordering`);
5. admit     — in order, each job is admitted in the first flavor (cheapest first when
               price-aware) where quota, free GPUs and budget allow
               (`scheduler.admission.evaluate`);
6. preempt   — a job blocked by capacity or quota that preemption can help gets its victims
               (`scheduler.preemption`) before the next job is looked at, and is admitted on
               the GPUs they free, so no later job can take them; at most
               `max_preemption_plans` jobs preempt per cycle;
7. requeue   — jobs not admitted stay in their backlog with a `JobWaiting` event whenever
               their reason changed; preempted jobs go back to theirs (the state applies
               `JobPreempted` by requeueing the job with its original submit time).

A tick may bound its admissions (`run_cycle`'s `admit_limit`, what the service's tick has left
of `scheduler.admissions_per_tick`): once a cycle has admitted that many, every later job waits
with `tick_limit`, to be looked at by the next tick. A tick runs at most `MAX_CYCLES_PER_TICK`
cycles (the service's dispatcher, and the what-if replay's ticks, `scheduler.simulation`).

With `strict_fifo`, the first job that waits for free GPUs makes every later job wait behind
it; a job blocked by its own team's quota or budget does not hold up other teams.
`run_cycle` returns the events in the order they must be applied.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from ledger.job_events import JobEvent, JobWaiting, WaitReason
from scheduler.admission import Blocked, Fit, Verdict, Workspace, evaluate, nominate
from scheduler.decisions import admission_events, preemption_events
from scheduler.model import Flavor, Policy
from scheduler.model_choice import placement_note
from scheduler.ordering import Nomination, order
from scheduler.preemption import plan_preemption
from scheduler.snapshot import ClusterSnapshot

MAX_CYCLES_PER_TICK = 64  # a tick's cycles; what is still to admit after them waits a tick


@dataclass(frozen=True, slots=True)
class CycleResult:
    """What one cycle decided: the events to apply, in order, and what they amount to."""

    events: tuple[JobEvent, ...]
    decisions: int  # heads that got a verdict: admitted, or waiting with a reason
    admitted: tuple[str, ...]
    preempted: tuple[str, ...]


def requeue(waits: Iterable[Verdict], now_us: int) -> tuple[JobWaiting, ...]:
    """Phase 7: a `JobWaiting` for every waiting job whose reason changed."""
    return tuple(
        JobWaiting(job_id=v.job.spec.job_id, reason=v.reason, time_us=now_us, detail=v.detail)
        for v in waits
        if v.reason != v.job.last_wait
    )


def _preempt_and_fit(
    n: Nomination,
    blocked: Blocked,
    ws: Workspace,
    policy: Policy,
    failed: dict[tuple[str, Flavor, int], int],
    events: list[JobEvent],
    preempted: list[str],
) -> Fit | Blocked:
    spec = n.spec
    for flavor, quota in blocked.preemptible_in:
        key = (spec.team, flavor, n.priority)
        if failed.get(key, spec.gpus + 1) <= spec.gpus:
            continue  # a smaller job of this team and priority found no victims this cycle
        victims = plan_preemption(n, flavor, quota, ws, policy)
        if victims is None:
            failed[key] = spec.gpus
            continue
        for victim in victims:
            ws.release(victim.job)
            events.extend(preemption_events(victim.job, spec, victim.reason, ws.snap.now_us))
            preempted.append(victim.job.job_id)
        outcome = evaluate(replace(n, flavors=(flavor,)), ws, policy)
        if isinstance(outcome, Fit):
            snap = ws.snap
            note = placement_note(
                flavor, n.flavors, blocked.tried, snap.prices, snap.now_us, n.dropped, n.queue, True
            )
            outcome = replace(outcome, note=note)
        return outcome
    return blocked


def run_cycle(snap: ClusterSnapshot, policy: Policy, admit_limit: int | None = None) -> CycleResult:
    """Phases 3–7 over `snap` (whose heads are phase 1's output), admitting at most
    `admit_limit` jobs (None: no limit); the jobs ordered after the last one it allows wait
    with `tick_limit`."""
    nominations, waits = nominate(snap, snap.heads, policy)
    ordered = order(nominations, policy.ordering, snap)
    ws = Workspace(snap)
    events: list[JobEvent] = []
    admitted: list[str] = []
    preempted: list[str] = []
    failed: dict[tuple[str, Flavor, int], int] = {}
    plans_left = policy.max_preemption_plans
    blocking: str | None = None
    for n in ordered:
        spec = n.spec
        if blocking is not None:
            waits.append(Verdict(n.job, WaitReason.BEHIND_HEAD, f"behind job {blocking}"))
            continue
        if admit_limit is not None and len(admitted) >= admit_limit:
            detail = "the tick admitted as many jobs as it may; the next tick looks at it"
            waits.append(Verdict(n.job, WaitReason.TICK_LIMIT, detail))
            continue
        outcome = evaluate(n, ws, policy)
        if isinstance(outcome, Blocked) and outcome.preemptible_in and plans_left > 0:
            before = len(preempted)
            outcome = _preempt_and_fit(n, outcome, ws, policy, failed, events, preempted)
            plans_left -= len(preempted) > before
        if isinstance(outcome, Fit):
            preemptible = n.queue.preemptible or outcome.over_budget
            ws.take(spec.team, outcome.flavor, outcome.gpus, outcome.hold, spec.gpu_share)
            events.extend(
                admission_events(
                    spec,
                    outcome.flavor,
                    outcome.gpus,
                    priority=n.priority,
                    borrowed=outcome.borrowed,
                    preemptible=preemptible,
                    hold=outcome.hold,
                    attempt=n.job.attempt,
                    over_budget=outcome.over_budget,
                    now_us=snap.now_us,
                    placement=outcome.note,
                )
            )
            admitted.append(spec.job_id)
        else:
            waits.append(Verdict(n.job, outcome.reason, outcome.detail))
            if policy.strict_fifo and outcome.reason is WaitReason.NO_CAPACITY:
                blocking = spec.job_id
    events.extend(requeue(waits, snap.now_us))
    return CycleResult(
        events=tuple(events),
        decisions=len(admitted) + len(waits),
        admitted=tuple(admitted),
        preempted=tuple(preempted),
    )
