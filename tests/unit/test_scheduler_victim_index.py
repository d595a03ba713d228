"""The indexes that keep cycles cheap at scale decide exactly what a plain scan decides.

Random workloads (seeded, the simulation test's) replayed through the real state and cycle;
after every batch of events, independently of the index:
- `ClusterSnapshot.running` equals each (team, flavor)'s running jobs in order of admission,
  rebuilt from the state's job table, and `ClusterSnapshot.victims` equals its preemptible
  jobs sorted by `victim_key`;
- preemption's candidates for every head and candidate flavor — with and without jobs
  preempted earlier in the cycle — equal a plain scan: every running job of the cohort
  filtered by the documented rules, then sorted by the preference key;
- a cycle decides the same on the indexed snapshot as on one without the index.
The executor's `JobStarted` is played at random, so records change while jobs run.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace

import pytest

from ledger.job_events import JobEvent, JobStarted, PreemptReason
from scheduler.admission import Workspace, nominate
from scheduler.cycle import run_cycle
from scheduler.model import FIFO_POLICY, Flavor, Ordering, Policy, RunningJob
from scheduler.ordering import Nomination
from scheduler.preemption import _candidates
from scheduler.quota import UNITS, units_of
from scheduler.running_index import victim_key
from scheduler.simulation import Simulation
from scheduler.snapshot import ClusterSnapshot
from scheduler.state import SchedulerState
from tests.scheduler_builders import HOUR_US, MINUTE_US, prices
from tests.unit.test_scheduler_simulation import (
    BALANCES,
    FLEET,
    QUEUES,
    random_jobs,
    random_teams,
)


def plain_candidates(
    n: Nomination, flavor: Flavor, ws: Workspace, policy: Policy
) -> list[tuple[RunningJob, PreemptReason, bool]]:
    """Preemption's candidates by a scan of every running job (the rules of
    `scheduler.preemption`), sorted by the documented preference."""
    book = ws.snap.quotas
    team = n.spec.team
    within_nominal = True
    teams: tuple[str, ...] = (team,)
    if not policy.enforce_quota:
        teams = tuple({t for t, f in ws.snap.running if f == flavor})
    else:
        within_nominal = ws.used(team, flavor) + units_of(n.spec) <= (
            book.quota[(team, flavor)].nominal * UNITS
        )
        cohort = book.cohort_of(team)
        if cohort is not None:
            teams = book.members.get((cohort, flavor), teams)
    found = []
    for other in teams:
        borrowing = policy.enforce_quota and other != team
        if borrowing:
            borrowing = ws.used(other, flavor) > book.quota[(other, flavor)].nominal * UNITS
        for job in ws.snap.running.get((other, flavor), ()):
            if not job.preemptible or job.job_id in ws.removed:
                continue
            lower = job.priority < n.priority
            if job.over_budget:
                found.append((job, PreemptReason.OVER_BUDGET, False))
            elif not policy.enforce_quota or other == team:
                if lower:
                    found.append((job, PreemptReason.HIGHER_PRIORITY, False))
            elif borrowing and within_nominal:
                found.append((job, PreemptReason.RECLAIM_LENT_QUOTA, True))
            elif borrowing and lower:
                found.append((job, PreemptReason.HIGHER_PRIORITY, True))
    found.sort(
        key=lambda c: (
            not c[0].over_budget,
            c[0].priority,
            -c[0].since_us,
            -c[0].spec.submit_us,
            c[0].job_id,
        )
    )
    return found


class Checker:
    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.rng = random.Random(7)
        self.order: dict[str, int] = {}  # job → when its running record was last set
        self.stamp = 0
        self.compared = 0

    def __call__(self, events: Sequence[JobEvent], state: SchedulerState) -> None:
        now = max((e.time_us for e in events), default=0)
        for job in state.running_jobs():
            if job.job_id not in self.order:
                self.stamp += 1
                self.order[job.job_id] = self.stamp
        running = {j.job_id for j in state.running_jobs()}
        self.order = {j: s for j, s in self.order.items() if j in running}
        not_started = [j for j in state.running_jobs() if j.started_us is None]
        if not_started and self.rng.random() < 0.5:  # the executor reports a start (later
            job = self.rng.choice(not_started)  # than admission: it moves in victim order)
            state.apply(JobStarted(job.job_id, now + MINUTE_US))
            self.stamp += 1
            self.order[job.job_id] = self.stamp  # a changed record moves to the end
        snap = state.snapshot(now, self.policy.heads_per_queue)
        groups: dict[tuple[str, Flavor], list[RunningJob]] = {}
        for job in sorted(state.running_jobs(), key=lambda j: self.order[j.job_id]):
            groups.setdefault((job.team, job.flavor), []).append(job)
        assert {k: list(v) for k, v in snap.running.items()} == groups
        assert snap.victims is not None
        assert {k: list(v) for k, v in snap.victims.items() if v} == {
            k: sorted((victim_key(j), j) for j in jobs if j.preemptible)
            for k, jobs in groups.items()
            if any(j.preemptible for j in jobs)
        }
        self.compare_candidates(snap)
        plain = replace(snap, victims=None)
        assert run_cycle(snap, self.policy) == run_cycle(plain, self.policy)

    def compare_candidates(self, snap: ClusterSnapshot) -> None:
        nominations, _ = nominate(snap, snap.heads, self.policy)
        for n in nominations:
            ws = Workspace(snap)
            running = list(snap.running_jobs())
            if running and self.rng.random() < 0.5:  # as if preempted earlier this cycle
                for job in self.rng.sample(running, min(3, len(running))):
                    ws.release(job)
            for flavor in n.flavors:
                found = _candidates(n, flavor, ws, self.policy)
                got = [(c.job, c.reason, c.borrower) for c in found]
                assert got == plain_candidates(n, flavor, ws, self.policy)
                self.compared += len(got)


POLICIES = [
    pytest.param(Policy(), id="tally"),
    pytest.param(Policy(ordering=Ordering.REQUESTED_SHARE, heads_per_queue=3), id="request-share"),
    pytest.param(replace(FIFO_POLICY, preemption=True), id="fifo-no-quota-preempting"),
]


@pytest.mark.parametrize("policy", POLICIES)
def test_indexes_decide_what_a_plain_scan_decides(policy: Policy) -> None:
    rng = random.Random(11)
    teams = random_teams(rng)
    state = SchedulerState(QUEUES, teams, FLEET, prices=prices(), half_life_us=6 * HOUR_US)
    for balance in BALANCES:
        state.set_balance(balance)
    checker = Checker(policy)
    sim = Simulation(state, policy, listener=checker, meter_interval_us=10 * MINUTE_US)
    report = sim.run(random_jobs(rng, 150), overdue_interval_us=10 * MINUTE_US)
    assert report.preemptions > 0 or not policy.preemption
    assert checker.compared > 100  # the candidate lists compared were not all empty
