"""The scheduler's alerts for the alerts topic: a job holding GPUs idle longer than its queue
allows (`tally.job.idle`), and a job pending longer than its queue's threshold
(`tally.job.pending`), each resolved when the condition clears.

The scheduler is where both are known: idle reclaim (`scheduler.reclaim.idle_decisions`) finds
the jobs whose GPUs have been idle past their queue's `idle_reclaim` allowance and that policy
says to report rather than stop, and the state knows every pending job and its submit time.
`JobAlertWatch.tick` turns what one tick found into alerts through the pure
`ledger.alert_rules.job_step` / `overdue`; `observe` rebuilds what is open from the alerts
topic the scheduler reads from the start, so a restart neither repeats nor forgets them (an
alert raised again has the same content-derived id, and delivery drops it).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

from ledger.alert_rules import JobMemory, Waiting, job_step, overdue
from ledger.fleet_alerts import FleetKind, JobAlert, encode_fleet_alert
from scheduler.model import PendingJob
from scheduler.reclaim import IdleAlert
from scheduler.state import SchedulerState

_OPENING = {FleetKind.JOB_IDLE_RESOLVED: FleetKind.JOB_IDLE}
_OPENING[FleetKind.JOB_PENDING_RESOLVED] = FleetKind.JOB_PENDING


@dataclass(frozen=True, slots=True)
class PendingRules:
    """How long a job may wait before `tally.job.pending`: `queues[name]`, else `after_us`
    (None: only the queues named)."""

    after_us: int | None = None
    queues: Mapping[str, int] = field(default_factory=dict)

    @property
    def enabled(self) -> bool:
        return self.after_us is not None or bool(self.queues)


class JobAlertWatch:
    """What the scheduler has raised and not resolved, and the rules it raises by."""

    def __init__(self, pending: PendingRules | None = None, idle: bool = True) -> None:
        self.pending = pending or PendingRules()
        self.idle = idle
        self.memory = JobMemory()
        self.outbox: list[tuple[bytes, bytes]] = []  # (key, value) for the alerts topic

    def after_tick(self, now_us: int, idle: Iterable[IdleAlert], state: SchedulerState) -> None:
        """Queue in `outbox` what the tick that left `state` raised and resolved."""
        allowed = {name: q.idle.after_us for name, q in state.queues.items()}
        running = {job.job_id for job in state.running_jobs()}
        raised = self.tick(now_us, idle, allowed, state.pending_jobs(), running)
        self.outbox.extend(alert_messages(raised))

    def take(self) -> list[tuple[bytes, bytes]]:
        out, self.outbox = self.outbox, []
        return out

    def observe(self, alert: JobAlert) -> None:
        """An alert read back from the topic (ours, perhaps from before a restart)."""
        opened = dict(self.memory.open)
        if alert.kind in _OPENING:
            key = (_OPENING[alert.kind], alert.job)
            if key in opened and opened[key].since_us == alert.since_us:
                del opened[key]
        else:
            opened[(alert.kind, alert.job)] = alert
        self.memory = JobMemory(opened)

    def tick(
        self,
        now_us: int,
        idle: Iterable[IdleAlert],
        idle_allowed_us: Mapping[str, int],
        pending: Iterable[PendingJob],
        running: Collection[str],
    ) -> list[JobAlert]:
        """The alerts one scheduling tick raises and resolves."""
        out: list[JobAlert] = []
        if self.idle:
            found = [
                JobAlert(
                    kind=FleetKind.JOB_IDLE,
                    job=a.job_id,
                    team=a.team,
                    queue=a.queue,
                    since_us=a.idle_since_us,
                    at_us=now_us,
                    limit_us=idle_allowed_us.get(a.queue, 0),
                    gpus=a.gpus,
                    idle_gpus=len(a.idle_gpus),
                )
                for a in idle
            ]
            ended = {
                job: "its GPUs are busy again" if job in running else "it no longer holds them"
                for _, job in self.memory.open
            }
            self.memory, raised = job_step(self.memory, FleetKind.JOB_IDLE, found, now_us, ended)
            out += raised
        if self.pending.enabled:
            waiting = [
                Waiting(
                    job=p.spec.job_id,
                    team=p.spec.team,
                    queue=p.spec.queue,
                    submitted_us=p.spec.submit_us,
                    gpus=p.spec.gpus,
                    reason=p.last_wait.value if p.last_wait else None,
                )
                for p in pending
            ]
            found = overdue(waiting, self.pending.queues, self.pending.after_us, now_us)
            ended = {
                job: "admitted" if job in running else "ended without running"
                for _, job in self.memory.open
            }
            self.memory, raised = job_step(self.memory, FleetKind.JOB_PENDING, found, now_us, ended)
            out += raised
        return out


def alert_messages(alerts: Iterable[JobAlert]) -> list[tuple[bytes, bytes]]:
    """(key, value) of each alert for the alerts topic, keyed by job id."""
    return [(a.job.encode(), encode_fleet_alert(a)) for a in alerts]
