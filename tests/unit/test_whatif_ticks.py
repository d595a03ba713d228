"""`tally whatif` replays tick by tick as the live service decides: the records here are made
by the live dispatcher itself (`tally.scheduling.build_dispatcher`, a manual clock, its
`decide` called once per tick of the config's `cycle_interval_s`, runs ending when their time
is up), not by the simulation the replay runs, so a replay that reproduces them decides as the
service did — submits that reached one live tick decided together in the cycle's order, a
run's GPUs free from the tick that saw it end, the tick's admission and cycles caps."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from ledger.job_events import (
    JobAdmitted,
    JobEvent,
    JobFailed,
    JobFinished,
    JobPreempted,
    JobReclaimed,
    JobSpec,
    JobSubmitted,
)
from scheduler.cycle import MAX_CYCLES_PER_TICK
from scheduler.executors.fake import RUNS_FOREVER, FakeExecutor, ManualClock
from scheduler.ports import JobStatus, RunState
from scheduler.whatif import History, divergences, metrics, read_history, replay, same_decisions
from scheduler.whatif.replay import Scenario
from tally import language
from tally.config import TallyConfig
from tally.scheduling import build_dispatcher
from tally.whatif import scenario_of
from tests.builders import T0_US
from tests.whatif_builders import HOUR_US, MINUTE_US, PROJECTS, whatif_config

SECOND_US = 1_000_000
NO_METERING = 10**15  # the live dispatcher here gets no metered usage (no ledger): nor the replay
SAME_TICK_US = 1_000  # a live tick's cycles take a µs each of its clock; the replay's share one


def _config(tmp_path, interval_s: float, price: str = "3.60", **scheduler: object) -> TallyConfig:
    nodes = int(scheduler.pop("nodes", 1))  # type: ignore[call-overload]
    data = whatif_config(price=price, nodes=nodes, nominal=80)
    data["scheduler"].update(
        work_dir=str(tmp_path / "scheduler"), cycle_interval_s=interval_s, **scheduler
    )
    return TallyConfig.model_validate(data)


def _scenario(config: TallyConfig, **changes: object) -> Scenario:
    scenario = scenario_of("a", config, T0_US)
    return replace(scenario, meter_interval_us=NO_METERING, **changes)  # type: ignore[arg-type]


def _spec(job_id: str, team: str, queue: str, gpus: int, at_us: int) -> JobSpec:
    return JobSpec(job_id, team, PROJECTS[team], "u", queue, gpus, at_us, HOUR_US)


def live_record(
    config: TallyConfig, jobs: list[tuple[JobSpec, int]], ticks: int, first_tick_us: int
) -> list[JobEvent]:
    """What the live dispatcher publishes for `jobs` ((spec, runtime) each): every submit at its
    own time, `decide` every `cycle_interval_s` from `first_tick_us`, each run reported finished
    at its end (admission + runtime) by the tick after it."""
    interval = int(config.scheduler.cycle_interval_s * SECOND_US)
    clock = ManualClock(T0_US)
    dispatcher = build_dispatcher(config, FakeExecutor(clock=clock, default=RUNS_FOREVER), clock)
    runtime = {spec.job_id: r for spec, r in jobs}
    todo = sorted(jobs, key=lambda j: j[0].submit_us)
    events: list[JobEvent] = []
    ends: dict[str, int] = {}  # running job → when its run ends
    for n in range(ticks):
        tick = first_tick_us + n * interval
        while todo and todo[0][0].submit_us <= tick:
            spec = todo.pop(0)[0]
            clock.now = spec.submit_us
            events.extend(dispatcher.apply((JobSubmitted(spec, spec.submit_us),)))
        clock.now = tick
        news = [
            JobStatus(job_id, RunState.FINISHED, end, 0, (), f"fake-{job_id}")
            for job_id, end in sorted(ends.items(), key=lambda e: e[1])
            if end <= tick
        ]
        decided = dispatcher.decide(news)
        events.extend(decided)
        for event in decided:
            if isinstance(event, JobAdmitted):
                ends[event.job_id] = event.time_us + runtime[event.job_id]
            elif isinstance(event, JobFinished | JobFailed | JobPreempted | JobReclaimed):
                ends.pop(event.job_id, None)
    return events


def _first_ticks(history: History) -> dict[int, int]:
    """How many jobs each live tick saw first."""
    seen: dict[int, int] = {}
    for job in history.jobs:
        assert job.seen_us is not None
        seen[job.seen_us] = seen.get(job.seen_us, 0) + 1
    return seen


# ---------------------------------------------------------------------- one tick, several submits


@pytest.mark.parametrize(
    ("woken_per_submit", "diverging"),
    [
        pytest.param(False, {}, id="the-live-tick-batch-is-reproduced"),
        pytest.param(
            True,
            {"early-train": "never admitted in the record (not yet considered, then no_capacity)",
             "late-prod": "the replay never admitted it (no_capacity)"},
            id="deciding-at-each-submit-diverges",
        ),
    ],
)  # fmt: skip
def test_submits_in_one_tick_are_decided_together_by_priority_not_arrival(
    tmp_path, woken_per_submit, diverging
):
    """A training job for the whole node, then 3 ms later a production one (priority 10) for
    it too, both before the live tick: the tick orders production first, the training job
    waits. A replay deciding at each submit would have started the training job alone."""
    config = _config(tmp_path, 1.0)
    jobs = [
        (_spec("early-train", "vision", "train", 4, T0_US), HOUR_US),
        (_spec("late-prod", "language", "prod", 4, T0_US + 3_000), HOUR_US),
    ]
    recorded = live_record(config, jobs, ticks=3, first_tick_us=T0_US + 5_000)
    history = read_history(recorded, T0_US, T0_US + HOUR_US // 2)
    assert [a.job_id for a in history.recorded] == ["late-prod"]
    assert set(_first_ticks(history).values()) == {2}  # both first seen by one tick
    if woken_per_submit:
        history = replace(history, jobs=tuple(replace(j, seen_us=None) for j in history.jobs))
    outcome = replay(history, _scenario(config))
    found = divergences(history.recorded, history.recorded_waits, outcome, SAME_TICK_US)
    assert {d.job_id: d.cause for d in found} == diverging


# ---------------------------------------------------------------------- the cycles cap


@pytest.mark.parametrize(
    ("max_cycles", "diverging"),
    [
        pytest.param(MAX_CYCLES_PER_TICK, {}, id="the-services-64-reproduce-the-record"),
        pytest.param(
            MAX_CYCLES_PER_TICK - 2,
            {"job-62": "the replay kept it waiting (cycle_limit)",
             "job-63": "the replay kept it waiting (cycle_limit)"},
            id="fewer-cycles-diverge-naming-cycle_limit",
        ),
    ],
)  # fmt: skip
def test_a_tick_runs_at_most_its_cycles_and_leaves_the_rest_to_the_next(
    tmp_path, max_cycles, diverging
):
    """One job considered per cycle (`heads_per_queue: 1`), 66 one-GPU jobs submitted at once
    on 68 GPUs: the live tick admits 64 in its 64 cycles, the timer's next tick the other two."""
    config = _config(tmp_path, 1.0, nodes=17, heads_per_queue=1)
    jobs = [(_spec(f"job-{n:02d}", "vision", "train", 1, T0_US + n), HOUR_US) for n in range(66)]
    recorded = live_record(config, jobs, ticks=3, first_tick_us=T0_US + SECOND_US)
    history = read_history(recorded, T0_US, T0_US + HOUR_US // 2)
    later = {a.job_id for a in history.recorded if a.time_us > T0_US + 2 * SECOND_US}
    assert len(history.recorded) == 66 and later == {"job-64", "job-65"}
    outcome = replay(history, _scenario(config, max_cycles_per_tick=max_cycles))
    found = divergences(history.recorded, history.recorded_waits, outcome, SAME_TICK_US)
    assert {d.job_id: d.cause for d in found} == diverging
    assert len(outcome.admissions) == 66  # every job by the timer's next tick
    zh = {d.said(language.reader(language.ZH_CN))[3] for d in found}
    assert zh <= {"回放中它仍在等待（本轮调度的循环次数已用完）"}


# ---------------------------------------------------------------------- a day of live ticks


def _busy_day(count: int, interval_us: int, seed: int = 5) -> list[tuple[JobSpec, int]]:
    """`count` jobs, one a tick on average (often several), at arbitrary µs: both teams, both
    queues, 1–4 GPUs, runs of 1–6 ticks and a half (so no run ends at a tick's first µs)."""
    rng = random.Random(seed)
    jobs, at = [], T0_US
    for n in range(count):
        at += rng.randrange(1, 2 * interval_us)
        team = rng.choice(("vision", "language"))
        queue = "prod" if rng.random() < 0.25 else "train"
        runtime = rng.randrange(1, 7) * interval_us + interval_us // 2
        jobs.append((_spec(f"job-{n:03d}", team, queue, rng.choice((1, 1, 2, 4)), at), runtime))
    return jobs


@pytest.fixture(scope="module")
def busy(tmp_path_factory: pytest.TempPathFactory) -> tuple[TallyConfig, History]:
    """A live record of 120 jobs on two nodes of 4 H100s, ticking every minute: several submits
    in many ticks, GPUs busy, production preempting training."""
    config = _config(tmp_path_factory.mktemp("busy"), 60.0, nodes=2)
    interval = 60 * SECOND_US
    jobs = _busy_day(120, interval)
    recorded = live_record(config, jobs, ticks=400, first_tick_us=T0_US + interval)
    return config, read_history(recorded, T0_US, T0_US + 400 * interval)


def test_the_same_config_reproduces_every_admission_of_a_live_record_with_shared_ticks(busy):
    config, history = busy
    assert max(_first_ticks(history).values()) >= 3 and len(history.recorded) >= 100
    outcome = replay(history, _scenario(config))
    assert outcome.preemption_events  # production took GPUs from training
    assert divergences(history.recorded, history.recorded_waits, outcome, SAME_TICK_US) == ()
    per_submit = replace(history, jobs=tuple(replace(j, seen_us=None) for j in history.jobs))
    apart = replay(per_submit, _scenario(config))  # deciding at each submit instead
    assert divergences(history.recorded, history.recorded_waits, apart, SAME_TICK_US)


def test_changing_only_prices_leaves_every_tick_decision_unchanged(busy, tmp_path):
    config, history = busy
    a = replay(history, _scenario(config))
    b = replay(history, _scenario(_config(tmp_path, 60.0, price="7.20", nodes=2)))
    assert same_decisions(a, b) and a.wait_reasons == b.wait_reasons
    ma, mb = metrics(a), metrics(b)
    assert ma.gpu_ms == mb.gpu_ms and sum(ma.gpu_ms.values()) > 0
    assert {t: 2 * c for t, c in ma.cost_micros.items()} == mb.cost_micros


# ---------------------------------------------------------------------- the tick interval


@pytest.mark.parametrize(
    ("interval_s", "admitted_after_us"),
    [
        pytest.param(60.0, 31 * MINUTE_US, id="a-minute-tick-sees-the-end-within-a-minute"),
        pytest.param(600.0, 40 * MINUTE_US, id="a-ten-minute-tick-sees-it-up-to-ten-later"),
    ],
)
def test_freed_gpus_are_seen_at_the_configs_next_tick(tmp_path, interval_s, admitted_after_us):
    """The node is busy until +30 min 30 s; a job waiting for it starts at the first tick
    after: baseline and alternative each tick on their own config's interval."""
    config = _config(tmp_path, interval_s)
    events: list[JobEvent] = [
        JobSubmitted(_spec("first", "vision", "train", 4, T0_US), T0_US),
        JobSubmitted(_spec("second", "vision", "train", 4, T0_US), T0_US),
    ]
    history = read_history(events, T0_US, T0_US + 2 * HOUR_US)
    first_runs = replace(history.jobs[0], runtime_us=30 * MINUTE_US + 30 * SECOND_US)
    history = replace(history, jobs=(first_runs, history.jobs[1]))
    outcome = replay(history, _scenario(config))
    first = {a.job_id: a.time_us - T0_US for a in outcome.admissions}
    assert first == {"first": 0, "second": admitted_after_us}
