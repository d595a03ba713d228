"""A restarted Slurm executor finds its Slurm jobs again from the `jobs` topic: the fold as a
table, and a dispatcher on the scripted Slurm runner that publishes to a real broker, then a
fresh one that replays that topic and still polls and cancels the Slurm jobs the first one
submitted."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from ledger.job_events import (
    FailReason,
    JobFailed,
    JobFinished,
    JobPreempted,
    JobReclaimed,
    JobStarted,
    PreemptReason,
)
from scheduler.executors.fake import ManualClock
from scheduler.executors.slurm import SlurmExecutor
from scheduler.executors.slurm_ids import SlurmJobs, slurm_jobs
from scheduler.jobs_topic import replay_order
from scheduler.kafka import KafkaPublisher, read_topic
from scheduler.ports import RunState, StopReason, Work
from scheduler.records import SubmitRequest
from scheduler.service import SchedulerService, ServiceSettings
from tally.config import parse_config
from tally.scheduling import build_dispatcher
from tests.conftest import create_topics
from tests.slurm.test_slurm_executor import ScriptedRunner, a_job, ok
from tests.unit.test_scheduler_service_support import SECOND_US, T0_US, config_data

T = T0_US


def started(job: str, slurm_id: str | None, t: int = T) -> JobStarted:
    return JobStarted(job, t, slurm_job_id=slurm_id)


def failed(job: str) -> JobFailed:
    return JobFailed(job, FailReason.CANCELLED, 1, False, T + 9)


def preempted(job: str) -> JobPreempted:
    return JobPreempted(job, "other", PreemptReason.RECLAIM_LENT_QUOTA, T + 5)


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        pytest.param([started("a", "41")], SlurmJobs({"a": "41"}), id="running"),
        pytest.param([started("a", None)], SlurmJobs(), id="not-under-slurm"),
        pytest.param([started("a", "41"), JobFinished("a", T + 1)], SlurmJobs(), id="finished"),
        pytest.param([started("a", "41"), failed("a")], SlurmJobs(), id="failed"),
        pytest.param(
            [started("a", "41"), JobReclaimed("a", ("GPU-1",), T, T + 2)],
            SlurmJobs(),
            id="reclaimed",
        ),
        pytest.param([started("a", "41"), preempted("a")], SlurmJobs({}, {"a": "41"}), id="parked"),
        pytest.param(
            [started("a", "41"), preempted("a"), failed("a")], SlurmJobs(), id="parked-cancelled"
        ),
        pytest.param(
            [started("a", "41"), preempted("a"), started("a", "41", T + 7)],
            SlurmJobs({"a": "41"}),
            id="parked-then-restarted",
        ),
        pytest.param(
            [started("a", "41"), started("b", "42"), JobFinished("a", T + 1), "not-an-event"],
            SlurmJobs({"b": "42"}),
            id="two-jobs-one-ended",
        ),
        pytest.param([preempted("a")], SlurmJobs(), id="preempted-before-any-start"),
    ],
)
def test_slurm_jobs_fold(events: list[object], expected: SlurmJobs) -> None:
    assert slurm_jobs(events) == expected


def test_a_rebuilt_parked_job_restarts_as_the_same_slurm_job(tmp_path: Path) -> None:
    runner = ScriptedRunner(
        {"scontrol update": [ok("scontrol", "")], "scontrol release": [ok("scontrol", "")]}
    )
    ex = SlurmExecutor(tmp_path, runner=runner)
    assert ex.rebuild([started("a", "41"), preempted("a")]) == 1
    assert (ex.parked(), ex.active(), ex.slurm_id("a")) == (("a",), (), "41")
    ex.start(a_job("a"), Work(command=("true",)))  # no sbatch: the scripted runner has none
    assert runner.calls == [
        ("scontrol", "update", "JobId=41", "StartTime=now"),
        ("scontrol", "release", "41"),
    ]
    assert ex.active() == ("a",)


# ---------------------------------------------------------------------------- real broker

RUNNING_41_42 = ok("squeue", "41|RUNNING|None\n42|RUNNING|None\n")


def _settings(bootstrap: str, tmp: Path) -> ServiceSettings:
    return ServiceSettings(
        bootstrap=(bootstrap,),
        jobs_topic="jobs",
        balances_topic="balances",
        alerts_topic="alerts",
        ledger_group="ledger",
        work_dir=tmp,
    )


@pytest.mark.broker
def test_a_restarted_scheduler_polls_and_cancels_the_slurm_jobs_it_submitted(
    broker, tmp_path: Path
) -> None:
    create_topics(broker.bootstrap, ["jobs"], partitions=2)
    data = config_data(tmp_path)
    data["scheduler"]["executor"] = "slurm"
    config = parse_config(data, "test.yaml")
    clock = ManualClock(T0_US)
    first_runner = ScriptedRunner(
        {
            "sbatch": [ok("sbatch", "41\n"), ok("sbatch", "42;cluster\n")],
            "squeue": [RUNNING_41_42],
            "scontrol --details": [ok("scontrol", "JobId=4 JobState=RUNNING GRES=gpu:1(IDX:0)")],
        }
    )
    first = SlurmExecutor(tmp_path / "logs", runner=first_runner, clock=clock)
    dispatcher = build_dispatcher(config, first, clock)

    async def run_first() -> list[str]:
        publisher = KafkaPublisher(_settings(broker.bootstrap, tmp_path))
        await publisher.start()
        try:
            service = SchedulerService(dispatcher, publisher)
            ids = []
            for team, project in (("vision", "detection"), ("language", "pretraining")):
                request = SubmitRequest(
                    team=team,
                    project=project,
                    user="ada",
                    queue="dev",
                    gpus=1,
                    work=Work(command=("sleep", "600")),
                )
                ids.append((await service.submit(request)).record.job_id)
            for _ in range(3):
                await service.tick()
                clock.advance(SECOND_US)
            return ids
        finally:
            await publisher.stop()

    vision, language = asyncio.run(run_first())
    assert {first.slurm_id(vision), first.slurm_id(language)} == {"41", "42"}
    messages = asyncio.run(read_topic(broker.bootstrap, "jobs", "restarted"))
    published = {  # the Slurm id of each job rides on its JobStarted
        e.job_id: e.slurm_job_id for _, e in replay_order(messages) if isinstance(e, JobStarted)
    }
    assert published == {vision: first.slurm_id(vision), language: first.slurm_id(language)}

    second_runner = ScriptedRunner(
        {
            "squeue": [
                RUNNING_41_42,  # stop: still running
                ok("squeue", f"{first.slurm_id(vision)}|CANCELLED|None\n"),  # and gone
                ok("squeue", f"{first.slurm_id(language)}|COMPLETED|None\n"),  # poll
            ],
            "scancel": [ok("scancel", "")],
            "sacct": [ok("sacct", f"{first.slurm_id(language)}|COMPLETED|0:0\n")],
        }
    )
    second = SlurmExecutor(tmp_path / "logs", runner=second_runner, clock=clock, interval_s=0)
    fresh = build_dispatcher(config, second, clock)
    fresh.replay(messages)
    assert {j.job_id for j in fresh.state.running_jobs()} == {vision, language}
    assert sorted(second.active()) == sorted([vision, language])
    assert second.slurm_id(vision) == first.slurm_id(vision)
    assert second.slurm_id(language) == first.slurm_id(language)
    assert fresh.recover() == []  # nothing lost: it still runs both

    (stopped,) = second.stop([vision], StopReason.CANCELLED)
    assert (stopped.state, stopped.native_id) == (RunState.STOPPED, first.slurm_id(vision))
    assert ("scancel", first.slurm_id(vision)) in second_runner.calls
    (ended,) = second.poll()  # reported RUNNING before the restart: not again
    assert (ended.job_id, ended.state, ended.exit_code) == (language, RunState.FINISHED, 0)
