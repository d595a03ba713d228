"""`tally whatif`'s wiring: configuration files → `scheduler.whatif.Scenario`s, and the ledger's
raw-event archive → a `History` (the one place a what-if touches files).

A scenario takes from its configuration everything `tally.scheduling` gives the live
scheduler — queues (priorities, classes, idle reclaim, model policy), teams with their quotas,
cohorts and weights, prices, the fair-share half-life, `heads_per_queue`, the tick's admission
cap (`admissions_per_tick`) and its timer (`cycle_interval_s`: the replay's ticks) — plus the
fleet (the configured fleet, `tally.scheduling.inventory_of`), and the budgets that apply to
the window's first month (a one-off budget of that month wins over a recurring one) as the
teams' starting balances. Fair share starts from the ledger's metered usage before the window,
as the live scheduler's does. `--add-gpus MODEL=N` adds N GPUs of MODEL to the alternative's
fleet, in nodes the size of the fleet's first node of that model, in its pool.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from ledger.periods import Period
from ledger.read.job_history import read_job_event_log
from ledger.read.metered import hourly_team_usage
from ledger.read.reports import ReportQueries
from ledger.units import US_PER_SECOND
from scheduler.model import Balance, Node, Policy
from scheduler.whatif import History, Scenario, read_history
from tally.config import ConfigError, TallyConfig
from tally.language import _
from tally.scheduling import inventory_of, queues_of, teams_of

US_PER_HOUR = 3_600 * US_PER_SECOND


def budgets_of(config: TallyConfig, since_us: int) -> tuple[Balance, ...]:
    """Each team's budget for the month `since_us` falls in, as a starting balance."""
    month = Period.containing(since_us).label
    chosen: dict[str, tuple[bool, Balance]] = {}
    for budget in config.budgets:
        if budget.period is not None and budget.period != month:
            continue
        one_off = budget.period is not None
        if budget.team in chosen and chosen[budget.team][0] and not one_off:
            continue
        balance = Balance(budget.team, money_micros=budget.money, gpu_ms=budget.gpu_hours)
        chosen[budget.team] = (one_off, balance)
    return tuple(b for _, b in sorted(chosen.values(), key=lambda c: c[1].team))


def add_gpus(nodes: tuple[Node, ...], added: Mapping[str, int]) -> tuple[Node, ...]:
    """`nodes` with `added[model]` more GPUs of each model; ConfigError for a model the fleet
    does not have (its pool and node size would be guesses)."""
    out = list(nodes)
    for model, count in sorted(added.items()):
        like = next((n for n in nodes if n.model == model), None)
        if like is None:
            known = ", ".join(sorted({n.model for n in nodes})) or _("none")
            raise ConfigError(
                _("--add-gpus: no GPU of model {model!r} in the fleet ({known})").format(
                    model=model, known=known
                )
            )
        size = max(1, len(like.gpu_uuids))
        left, index = count, 0
        while left > 0:
            take = min(size, left)
            name = f"whatif-{like.pool}-{index:03d}"
            while any(n.name == name for n in out):
                index += 1
                name = f"whatif-{like.pool}-{index:03d}"
            uuids = tuple(f"GPU-{name}-{i}" for i in range(take))
            out.append(Node(name, like.pool, model, uuids))
            left -= take
    return tuple(out)


def scenario_of(
    name: str, config: TallyConfig, since_us: int, added: Mapping[str, int] | None = None
) -> Scenario:
    s = config.scheduler
    nodes = inventory_of(config).nodes
    return Scenario(
        name=name,
        queues=queues_of(config),
        teams=teams_of(config),
        nodes=add_gpus(nodes, added or {}),
        prices=config.price_book(),
        half_life_us=int(s.fair_share_half_life_hours * US_PER_HOUR),
        policy=Policy(heads_per_queue=s.heads_per_queue),
        budgets=budgets_of(config, since_us),
        admissions_per_tick=s.admissions_per_tick,
        tick_us=max(1, int(s.cycle_interval_s * US_PER_SECOND)),
    )


def tolerance_us(config: TallyConfig) -> int:
    """How far a live admission may trail the replay's and still be the same decision: two
    cycle intervals (the replay ticks as the live loop does, but a live tick comes a moment
    later: the submit's publishing, the previous tick's length, the timer's drift)."""
    return int(2 * config.scheduler.cycle_interval_s * US_PER_SECOND)


def history_of(data_dir: Path, config: TallyConfig, since_us: int, until_us: int) -> History:
    """The window of the ledger's archived jobs topic; fair share before it from the ledger's
    metered usage (`ledger.read.metered`) when the ledger has any, else from the GPU time the
    archived runs held."""
    log = read_job_event_log(data_dir, config.topics.jobs)
    history = replace(read_history(log.events, since_us, until_us), undecodable=log.undecodable)
    q = ReportQueries(data_dir)
    try:
        metered = hourly_team_usage(q, since_us)
    finally:
        q.close()
    return replace(history, prior_gpu_ms=metered) if metered else history
