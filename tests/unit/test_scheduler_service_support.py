"""Builders shared by the scheduler service and API tests (no tests here): a small config with
queues, quotas and budgets rules, a dispatcher on the fake executor and a manual clock, and
helpers to feed it balances and alerts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ledger.alerts import AlertKind, IdleAlert, ResolveReason, encode_alert
from ledger.balances import BalanceUpdate, BudgetLine, BudgetStatus
from ledger.events import Owner
from ledger.job_events import JobEvent
from scheduler.dispatcher import Dispatcher
from scheduler.executors.fake import FakeExecutor, ManualClock, Outcome
from scheduler.ports import MemoryPublisher, Work
from scheduler.records import SubmitRequest
from scheduler.requests import RequestDesk
from scheduler.service import SchedulerService
from tally.config import TallyConfig, parse_config
from tally.scheduling import build_dispatcher

T0_US = 1_793_491_200_000_000  # 2026-11-01T00:00:00Z
SECOND_US = 1_000_000
MINUTE_US = 60 * SECOND_US
HOUR_US = 60 * MINUTE_US


def config_data(tmp: Path) -> dict[str, Any]:
    return {
        "broker": {"mode": "external", "bootstrap_servers": ["127.0.0.1:1"]},
        "ledger": {"data_dir": str(tmp / "ledger")},
        "organisation": {
            "cost_centres": [
                {
                    "name": "research",
                    "teams": [
                        {"name": "vision", "projects": ["detection"]},
                        {"name": "language", "projects": ["pretraining"]},
                    ],
                }
            ]
        },
        "fleet": {"pools": [{"name": "a100", "model": "A100", "nodes": 1, "gpus_per_node": 4}]},
        "prices": [{"model": "A100", "per_gpu_hour": "2.00"}],
        "quotas": [
            {"team": "vision", "pool": "a100", "model": "A100", "nominal": 2},
            {"team": "language", "pool": "a100", "model": "A100", "nominal": 2},
        ],
        "queues": [
            {"name": "dev", "class": "dev", "idle_reclaim": {"reclaim_after_min": 10}},
            {"name": "train", "class": "training", "retry_limit": 1, "max_runtime_hours": 1},
            {"name": "serve", "class": "inference", "preemptible": False, "priority": 10},
        ],
        "scheduler": {
            "work_dir": str(tmp / "scheduler"),
            "teams": [
                {"name": "vision", "cohort": "research"},
                {"name": "language", "cohort": "research"},
            ],
        },
    }


class Rig:
    """A dispatcher on the fake executor, a manual clock and an in-memory publisher."""

    def __init__(self, tmp: Path, data: dict[str, Any] | None = None) -> None:
        self.tmp = tmp
        self.config: TallyConfig = parse_config(data or config_data(tmp), "test.yaml")
        self.clock = ManualClock(T0_US)
        self.executor = FakeExecutor(clock=self.clock, default=Outcome(running_polls=1))
        self.dispatcher: Dispatcher = build_dispatcher(self.config, self.executor, self.clock)
        self.publisher = MemoryPublisher()
        self.requests = RequestDesk(self.config.approvals.policy(), self.publisher)
        self.service = SchedulerService(self.dispatcher, self.publisher, requests=self.requests)

    def events(self) -> list[Any]:
        return self.publisher.events()

    def job_events(self, job_id: str) -> list[str]:
        return [
            type(e).__name__
            for e in self.events()
            if getattr(e, "job_id", None) == job_id and not type(e).__name__.startswith("Gpu")
        ]

    async def submit(self, team: str = "vision", queue: str = "dev", gpus: int = 1, **kw: Any):
        request = SubmitRequest(
            team=team,
            project=kw.pop("project", "detection" if team == "vision" else "pretraining"),
            user="ada",
            queue=queue,
            gpus=gpus,
            work=kw.pop("work", Work(command=("true",))),
            **kw,
        )
        return (await self.service.submit(request)).record

    async def ticks(self, n: int = 1, step_us: int = SECOND_US) -> list[JobEvent]:
        out: list[JobEvent] = []
        for _ in range(n):
            out.extend(await self.service.tick())
            self.clock.advance(step_us)
        return out


def budget_update(
    team: str,
    seq: int,
    *,
    gpu_granted: int | None = None,
    gpu_consumed: int = 0,
    gpu_open_holds: int = 0,
    money_granted: int | None = None,
    money_consumed: int = 0,
    as_of_us: int = T0_US,
) -> BalanceUpdate:
    lines = []
    if money_granted is not None:
        lines.append(BudgetLine("money_micros", money_granted, money_consumed, 0))
    if gpu_granted is not None:
        lines.append(BudgetLine("gpu_ms", gpu_granted, gpu_consumed, gpu_open_holds))
    return BalanceUpdate(
        account=f"budget:{team}",
        seq=seq,
        as_of_us=as_of_us,
        current_period="2026-11",
        periods=(),
        totals=(),
        budget=BudgetStatus(team, "2026-11", tuple(lines)),
    )


def idle_alert(
    gpu: str, since_us: int, job: str | None, kind: AlertKind = AlertKind.DETECTED
) -> bytes:
    """An idle-GPU alert about `gpu` as the ledger publishes it on the alerts topic."""
    return encode_alert(
        IdleAlert(
            kind=kind,
            subject=gpu,
            gpu_uuid=gpu,
            node="node-a",
            pool="default",
            model="H100",
            owner=Owner(team="vision", job_id=job),
            since_us=since_us,
            at_us=since_us + 600_000_000,
            waste_gpu_ms=600_000,
            waste_micros=0,
            reason=ResolveReason.BUSY_AGAIN if kind is AlertKind.RESOLVED else None,
        )
    )
