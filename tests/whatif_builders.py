"""Builders for what-if tests and the what-if benchmark: a configuration with queues, quotas
and cohorts; a recorded history made by running the real scheduler simulation under it; and
that history written as the ledger's raw-event archive of the jobs topic (a real DuckDB ledger,
sealed), which is what `tally whatif` reads."""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ledger.ingest import ConsumedMessage, Ingestor
from ledger.job_events import JobEvent, JobSpec, encode_job_event
from ledger.pricing import PriceBook
from ledger.store.hot import DuckDBStore
from scheduler.simulation import SimJob, Simulation
from scheduler.state import SchedulerState
from scheduler.whatif import Scenario
from tests.builders import T0_US, a_config_dict

H100 = "NVIDIA H100 80GB HBM3"
MINUTE_US = 60_000_000
HOUR_US = 60 * MINUTE_US
DAY_US = 24 * HOUR_US
JOBS_TOPIC = "tally.jobs"
PROJECTS = {"vision": "detection", "language": "pretraining"}


def whatif_config(
    price: str = "3.60", nodes: int = 2, nominal: int = 8, **sections: Any
) -> dict[str, Any]:
    """Two teams in one cohort, each with a nominal quota of `nominal` H100s (the fleet of
    `nodes` × 4 GPUs, not the quota, is what binds by default), a preemptible training queue
    (one retry) and a non-preemptible production queue of higher priority."""
    data = a_config_dict(
        fleet={
            "seed": 7,
            "pools": [{"name": "h100", "model": H100, "nodes": nodes, "gpus_per_node": 4}],
        },
        prices=[{"model": H100, "per_gpu_hour": price}],
        queues=[
            {"name": "train", "class": "training", "retry_limit": 1},
            {"name": "prod", "class": "inference", "priority": 10, "preemptible": False},
        ],
        quotas=[
            {"team": team, "pool": "h100", "model": H100, "nominal": nominal}
            for team in ("vision", "language")
        ],
        scheduler={
            "teams": [
                {"name": "vision", "cohort": "research"},
                {"name": "language", "cohort": "research"},
            ]
        },
    )
    data.update(sections)
    return data


def workload(count: int, span_us: int, seed: int = 11, start_us: int = T0_US) -> list[SimJob]:
    """`count` jobs submitted over `span_us`: both teams, both queues, 1–4 GPUs, 20 min–6 h."""
    rng = random.Random(seed)
    jobs = []
    for n in range(count):
        team = rng.choice(("vision", "language"))
        queue = "prod" if rng.random() < 0.2 else "train"
        runtime = rng.randrange(20 * MINUTE_US, 6 * HOUR_US, MINUTE_US)
        spec = JobSpec(
            job_id=f"job-{n:04d}",
            team=team,
            project=PROJECTS[team],
            user=f"{team}-user",
            queue=queue,
            gpus=rng.choice((1, 1, 2, 4)),
            submit_us=start_us + n * span_us // count,
            estimated_runtime_us=HOUR_US,
        )
        jobs.append(SimJob(spec, runtime, failing_attempts=int(rng.random() < 0.05)))
    return jobs


def record(scenario: Scenario, jobs: Iterable[SimJob]) -> list[JobEvent]:
    """What the scheduler publishes running `jobs` under `scenario` (to their end), ticking as
    the live loop does (its timer every `scenario.tick_us`, woken by each submit)."""
    events: list[JobEvent] = []
    state = SchedulerState(
        scenario.queues,
        scenario.teams,
        scenario.nodes,
        prices=scenario.prices,
        half_life_us=scenario.half_life_us,
    )
    for balance in scenario.budgets:
        state.set_balance(balance)
    simulation = Simulation(
        state,
        scenario.policy,
        meter_interval_us=scenario.meter_interval_us,
        listener=lambda applied, _: events.extend(applied),
        admissions_per_tick=scenario.admissions_per_tick,
        tick_us=scenario.tick_us,
        max_cycles_per_tick=scenario.max_cycles_per_tick,
    )
    simulation.run(jobs)
    return events


def archive(data_dir: Path, events: Sequence[JobEvent], batch: int = 500) -> Path:
    """`events` as the jobs topic consumed by the ledger worker and sealed into the archive."""
    messages = [
        ConsumedMessage(JOBS_TOPIC, 0, offset, encode_job_event(event, "tally://scheduler"))
        for offset, event in enumerate(events)
    ]
    with DuckDBStore(data_dir) as store:
        ingestor = Ingestor(store, "c", PriceBook(()), {})
        for start in range(0, len(messages), batch):
            ingestor.apply(messages[start : start + batch])
        store.seal()
    return data_dir


def saved_whatif(data_dir: Path, work: Path, name: str = "more-h100") -> Path:
    """A what-if saved by the real `tally whatif --save` (two days of `workload` recorded
    under `whatif_config()`, 4 H100s added), copied into `data_dir`'s `whatif/` folder for the
    dashboard's What-if page; its path."""
    import shutil

    from click.testing import CliRunner

    from tally.cli import cli
    from tally.config import TallyConfig
    from tally.whatif import scenario_of
    from tests.conftest import write_config

    data = whatif_config()
    events = record(
        scenario_of("live", TallyConfig.model_validate(data), T0_US), workload(60, 2 * DAY_US)
    )
    ledger = archive(work / "ledger", events)
    config = write_config(work / "tally.yaml", data)
    window = ["--since", str(T0_US), "--until", str(T0_US + 2 * DAY_US)]
    argv = ["whatif", "-c", str(config), "--data-dir", str(ledger), *window,
            "--add-gpus", f"{H100}=4", "--save", name]  # fmt: skip
    result = CliRunner().invoke(cli, argv)
    assert result.exit_code == 0, result.output
    target = data_dir / "whatif"
    target.mkdir(exist_ok=True)
    return Path(shutil.copy(ledger / "whatif" / f"{name}.json", target))
