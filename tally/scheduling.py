"""The scheduler's wiring: `TallyConfig` → the scheduler's domain values, its inventory, its API
tokens and the service settings (the one place config becomes `scheduler` objects; `scheduler`
itself imports only `ledger`).

- queues: `queues:`, with their model policy (`allowed_models`, `forbidden_models`); an
  `idle_reclaim` left out takes the class default (`scheduler.model.DEFAULT_IDLE_POLICY`);
  `priority_bounds` → `scheduler.records.PriorityBounds` (what a team's token may ask for);
- teams: every team of the organisation, with its `quotas:` per (pool, model) and its
  `scheduler.teams` entry (cohort, weight); a team with no quota cannot run jobs;
- inventory: `tally scheduler run` places only on the GPUs the collectors report, read from
  the `inventory` topic (`scheduler.inventory.FleetInventory`, stale after
  `inventory.stale_after_intervals` sampling intervals); `CUDA_VISIBLE_DEVICES` gets the GPU's
  reported index on its node. `inventory_of` (the simulated fleet's GPUs, fixed) is only for
  what runs without collectors: the scheduler simulation and tests;
- tokens: from `scheduler.tokens` (environment variables win over the file); never from the
  configuration file itself.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ledger.invalid import Invalid
from ledger.roles import Caller, Role
from ledger.units import US_PER_SECOND
from scheduler.api import Tokens
from scheduler.api.oidc import OidcSettings, OidcVerifier
from scheduler.dispatcher import Dispatcher, TeamBudgetRules
from scheduler.inventory import FleetInventory
from scheduler.job_alerts import JobAlertWatch
from scheduler.model import (
    DEFAULT_IDLE_POLICY,
    US_PER_MINUTE,
    IdleAction,
    IdlePolicy,
    Node,
    OverBudget,
    Policy,
    Queue,
    QueueClass,
    Quota,
    Team,
)
from scheduler.model import Flavor as CoreFlavor
from scheduler.ports import Clock, Executor
from scheduler.records import PriorityBounds
from scheduler.service import ServiceSettings, WallClock
from scheduler.state import SchedulerState
from tally.components import simulated_fleet
from tally.config import ConfigError, TallyConfig
from tally.config_fields import secret_from_env
from tally.config_yaml import YamlRefused, read_yaml
from tally.identity_config import slurm_account_of_team
from tally.language import _, translate
from tally.scheduler_config import QueueConfig

US_PER_HOUR = 3_600 * US_PER_SECOND
MIN_TOKEN_LENGTH = 16


def _idle_policy(queue: QueueConfig, queue_class: QueueClass) -> IdlePolicy:
    rule = queue.idle_reclaim
    if rule is None:
        return DEFAULT_IDLE_POLICY[queue_class]
    if rule == "never":
        return IdlePolicy(IdleAction.NEVER)
    if rule == "alert":
        return IdlePolicy(IdleAction.ALERT)
    if isinstance(rule, str):  # the config model admits no other text
        raise ConfigError(
            _("queues: {queue}: unknown idle_reclaim {rule!r}").format(queue=queue.name, rule=rule)
        )
    if rule.reclaim_after_min is not None:
        return IdlePolicy(IdleAction.RECLAIM, int(rule.reclaim_after_min * US_PER_MINUTE))
    return IdlePolicy(IdleAction.ALERT, int((rule.alert_after_min or 0) * US_PER_MINUTE))


def queues_of(config: TallyConfig) -> tuple[Queue, ...]:
    out = []
    for q in config.queues:
        queue_class = QueueClass(q.queue_class)
        out.append(
            Queue(
                name=q.name,
                queue_class=queue_class,
                priority=q.priority,
                preemptible=q.preemptible,
                idle=_idle_policy(q, queue_class),
                max_runtime_us=None
                if q.max_runtime_hours is None
                else int(q.max_runtime_hours * US_PER_HOUR),
                over_budget=OverBudget.RUN_PREEMPTIBLE
                if q.run_preemptible_when_over_budget
                else OverBudget.WAIT,
                max_retries=q.retry_limit,
                allowed_models=q.allowed_models,
                forbidden_models=q.forbidden_models,
            )
        )
    return tuple(out)


def teams_of(config: TallyConfig) -> tuple[Team, ...]:
    extra = {t.name: t for t in config.scheduler.teams}
    quotas: dict[str, list[Quota]] = {}
    for q in config.quotas:
        quotas.setdefault(q.team, []).append(
            Quota(CoreFlavor(q.pool, q.flavor_model), q.nominal, q.borrowing_limit, q.lending_limit)
        )
    out = []
    for team in config.organisation.teams():
        more = extra.get(team.name)
        out.append(
            Team(
                team.name,
                tuple(quotas.get(team.name, ())),
                cohort=None if more is None else more.cohort,
                weight=None if more is None else more.weight,
            )
        )
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Inventory:
    """A fixed set of GPUs to hand out, and what `CUDA_VISIBLE_DEVICES` calls each."""

    nodes: tuple[Node, ...]
    device_ids: Mapping[str, str]


def inventory_of(config: TallyConfig) -> Inventory:
    """The simulated fleet's GPUs, fixed: one `Node` per simulated node, devices by index (for
    the scheduler simulation and tests; the service reads the inventory topic instead)."""
    by_node: dict[str, list[Any]] = {}
    for gpu in simulated_fleet(config).gpus:
        by_node.setdefault(gpu.node, []).append(gpu)
    nodes = tuple(
        Node(name, gpus[0].pool, gpus[0].model, tuple(g.uuid for g in gpus))
        for name, gpus in by_node.items()
    )
    devices = {g.uuid: str(g.index) for gpus in by_node.values() for g in gpus}
    return Inventory(nodes, devices)


def budget_rules(config: TallyConfig) -> dict[str, TeamBudgetRules]:
    return {
        t.name: TeamBudgetRules(t.overdraft_money, t.overdraft_gpu_hours)
        for t in config.scheduler.teams
    }


def priority_bounds_of(config: TallyConfig) -> dict[str, PriorityBounds]:
    """Per queue, the job priorities a team's token may ask for."""
    return {
        q.name: PriorityBounds(q.priority_bounds.min, q.priority_bounds.max) for q in config.queues
    }


def projects_of(config: TallyConfig) -> dict[str, tuple[str, ...]]:
    return {t.name: tuple(t.projects) for t in config.organisation.teams()}


# ---------------------------------------------------------------------------- tokens


NamedTokens = dict[str, Caller]  # token → the caller it names


def _named_tokens(path: Path, entries: Any) -> NamedTokens:
    """The file's `tokens:` list: each entry a `name`, a `token`, a `role` and, for `team-lead`
    and `member`, a `team` (a member also a `user`, whose jobs are its own)."""
    if not isinstance(entries, list):
        raise ConfigError(
            _("{path}: tokens: expected a list of {{name, token, role, team, user}}").format(
                path=path
            )
        )
    named: NamedTokens = {}
    names: set[str] = set()
    for index, entry in enumerate(entries):
        where = f"{path}: tokens[{index}]"
        fields = {"name", "token", "role", "team", "user"}
        if not isinstance(entry, dict) or set(entry) - fields:
            raise ConfigError(
                _("{where}: expected a mapping of {fields}").format(
                    where=where, fields=", ".join(sorted(fields))
                )
            )
        if not all(isinstance(v, str) for v in entry.values()):
            raise ConfigError(_("{where}: every field is a string").format(where=where))
        if not entry.get("name") or not entry.get("token"):
            raise ConfigError(_("{where}: `name` and `token` are required").format(where=where))
        roles = ", ".join(Role)
        if entry.get("role") not in set(Role):
            raise ConfigError(
                _("{where}: role: one of {roles}, not {value}").format(
                    where=where, roles=roles, value=repr(entry.get("role"))
                )
            )
        try:
            caller = Caller(
                Role(entry["role"]), entry.get("team"), entry.get("user"), entry["name"]
            )
        except Invalid as exc:  # a team for an organisation-wide role, or none for a team's
            raise ConfigError(f"{where}: {exc.say(translate)}") from None
        if caller.label in names:
            raise ConfigError(
                _("{where}: the name {name} is used twice").format(
                    where=where, name=repr(caller.label)
                )
            )
        if entry["token"] in named:
            raise ConfigError(_("scheduler tokens: two principals share a token"))
        names.add(entry["name"])
        named[entry["token"]] = caller
    return named


def _read_tokens_file(path: Path) -> tuple[str | None, dict[str, str], NamedTokens]:
    try:
        data = read_yaml(path.read_text())
    except FileNotFoundError:
        raise ConfigError(_("{path}: no such tokens file").format(path=path)) from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError, YamlRefused) as exc:
        raise ConfigError(
            _("{path}: cannot read the tokens file: {problem}").format(path=path, problem=exc)
        ) from None
    if data is None:
        return None, {}, {}
    if not isinstance(data, dict) or set(data) - {"admin", "teams", "tokens"}:
        raise ConfigError(
            _("{path}: expected a mapping with `admin`, `teams` and `tokens`").format(path=path)
        )
    admin = data.get("admin")
    teams = data.get("teams") or {}
    if admin is not None and not isinstance(admin, str):
        raise ConfigError(_("{path}: admin: expected a string").format(path=path))
    if not isinstance(teams, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in teams.items()
    ):
        raise ConfigError(_("{path}: teams: expected a mapping of team → token").format(path=path))
    return admin, dict(teams), _named_tokens(path, data.get("tokens") or [])


def load_tokens(config: TallyConfig, environ: Mapping[str, str] | None = None) -> Tokens:
    """The API's tokens: the file's, overridden by the environment. The admin token is the
    `admin` role, a team's token that team's `team-lead`; the file's `tokens:` list names tokens
    of any role. Raises ConfigError for a
    token shorter than 16 characters, one shared by two principals, an unknown team, or a
    variable named in `team_env` (or an `admin_env` the config names explicitly) that is not
    set while the tokens file has no token for it either."""
    env = os.environ if environ is None else environ
    spec = config.scheduler.tokens
    admin: str | None = None
    teams: dict[str, str] = {}
    named: NamedTokens = {}
    if spec.file is not None:
        admin, teams, named = _read_tokens_file(spec.file)
    if spec.admin_env and env.get(spec.admin_env):
        admin = env[spec.admin_env]
    elif spec.admin_env and admin is None and "admin_env" in spec.model_fields_set:
        secret_from_env("scheduler.tokens.admin_env", spec.admin_env, env)  # raises: not set
    for team, name in spec.team_env.items():
        if env.get(name):
            teams[team] = env[name]
        elif team not in teams:  # neither the variable nor the file has it
            secret_from_env(f"scheduler.tokens.team_env.{team}", name, env)
    known = {t.name for t in config.organisation.teams()}
    unknown = sorted((set(teams) | {c.team for c in named.values() if c.team}) - known)
    if unknown:
        raise ConfigError(
            _("scheduler tokens: unknown team(s) {teams}").format(teams=", ".join(unknown))
        )
    every = [*([admin] if admin else []), *teams.values(), *named]
    if any(len(token) < MIN_TOKEN_LENGTH for token in every):
        raise ConfigError(
            _("scheduler tokens: every token needs {length}+ characters").format(
                length=MIN_TOKEN_LENGTH
            )
        )
    if len(set(every)) != len(every):
        raise ConfigError(_("scheduler tokens: two principals share a token"))
    return Tokens(admin=admin, teams=teams, named=named)


def oidc_verifier(config: TallyConfig) -> OidcVerifier | None:
    """The API's verifier of people's bearer JWTs (`auth.oidc`); None: not configured."""
    oidc = config.auth.oidc
    if oidc is None:
        return None
    settings = OidcSettings(
        issuer=oidc.issuer,
        audience=oidc.audience,
        rules=oidc.rules(),
        user_claim=oidc.user_claim,
        discovery_url=oidc.discovery(),
        algorithms=oidc.algorithms,
        clock_skew_s=oidc.clock_skew_s,
        jwks_refresh_s=oidc.jwks_refresh_s,
        jwks_refetch_min_s=oidc.jwks_refetch_min_s,
    )
    return OidcVerifier(settings)


def ensure_tokens_file(config: TallyConfig) -> Path | None:
    """Create the configured tokens file with fresh random tokens if it does not exist (mode
    0600): what `tally up` does so the embedded stack needs no setup. None: none configured."""
    path = config.scheduler.tokens.file
    if path is None or path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "admin": secrets.token_urlsafe(24),
        "teams": {t.name: secrets.token_urlsafe(24) for t in config.organisation.teams()},
    }
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write("# bearer tokens of the scheduler API (created by `tally up`)\n")
        yaml.safe_dump(data, out, sort_keys=False)
    return path


# ---------------------------------------------------------------------------- the service


def api_url(config: TallyConfig) -> str:
    s = config.scheduler
    host = f"[{s.host}]" if ":" in s.host else s.host
    return f"http://{host}:{s.port}"


def service_settings(
    config: TallyConfig,
    bootstrap: tuple[str, ...],
    kafka_options: Mapping[str, Any] | None = None,
) -> ServiceSettings:
    """The service's settings; `kafka_options`: the security keywords of every Kafka client
    (`tally.kafka_clients`)."""
    s = config.scheduler
    return ServiceSettings(
        bootstrap=bootstrap,
        kafka_options=dict(kafka_options or {}),
        client_id=config.broker.client_id,
        jobs_topic=config.topics.jobs,
        balances_topic=config.topics.balances,
        admin_topic=config.topics.admin,
        approvals=config.approvals.policy(),
        alerts_topic=config.topics.alerts,
        ledger_group=config.worker.group_id,
        cycle_interval_s=s.cycle_interval_s,
        policy=Policy(heads_per_queue=s.heads_per_queue),
        half_life_us=int(s.fair_share_half_life_hours * US_PER_HOUR),
        default_estimate_us=int(s.default_estimated_runtime_hours * US_PER_HOUR),
        work_dir=s.work_dir,
        api_host=s.host,
        api_port=s.port,
        max_body_bytes=s.max_body_kib * 1024,
        inventory_topic=config.topics.inventory,
        gil_switch_interval_s=s.gil_switch_interval_us / 1_000_000,
    )


def fleet_inventory(config: TallyConfig) -> FleetInventory:
    """The service's copy of the inventory topic, with the configured staleness."""
    return FleetInventory(config.inventory.stale_after_intervals)


def scheduler_state(config: TallyConfig, inventory: Inventory | None = None) -> SchedulerState:
    """The core's state from config: queues, teams and quotas, the fleet, prices, half-life."""
    chosen = inventory if inventory is not None else inventory_of(config)
    return SchedulerState(
        queues_of(config),
        teams_of(config),
        chosen.nodes,
        prices=config.price_book(),
        half_life_us=int(config.scheduler.fair_share_half_life_hours * US_PER_HOUR),
    )


def configured_executor(config: TallyConfig, inventory: Inventory | FleetInventory) -> Executor:
    """The executor `scheduler.executor` names (the local one reads `inventory.device_ids` as
    it changes), running jobs as `identity.os_users` says; Slurm's with each team's account."""
    s = config.scheduler
    os_users = config.identity.os_users.mapping()
    if s.executor == "slurm":
        from scheduler.executors.slurm import SlurmExecutor

        return SlurmExecutor(
            s.work_dir / "logs",
            partition=s.slurm.partition,
            pin_nodes=s.slurm.pin_nodes,
            extra_args=s.slurm.extra_args,
            shards_per_gpu=s.slurm.shards_per_gpu,
            accounts=slurm_account_of_team(config.identity.slurm_accounts),
            os_users=os_users,
        )
    from scheduler.executors.local import LocalExecutor

    return LocalExecutor(s.work_dir / "logs", device_ids=inventory.device_ids, os_users=os_users)


def build_dispatcher(
    config: TallyConfig,
    executor: Executor | None = None,
    clock: Clock | None = None,
    inventory: FleetInventory | None = None,
) -> Dispatcher:
    """The service's dispatcher with the configured executor (logs in `work_dir/logs`): local
    (devices by index) or Slurm (`sbatch --gres=gpu:N`), unless another executor is given.
    With `inventory` its fleet starts empty and follows the inventory (what the service does);
    without, it is the simulated fleet, fixed (the simulation, tests)."""
    fixed = inventory_of(config) if inventory is None else Inventory((), {})
    s = config.scheduler
    rules = config.alerts.rules  # job idle / pending alerts (`scheduler.job_alerts`)
    chosen = executor or configured_executor(config, inventory or fixed)
    return Dispatcher(
        scheduler_state(config, fixed),
        chosen,
        clock or WallClock(),
        s.work_dir,
        policy=Policy(heads_per_queue=s.heads_per_queue),
        projects=projects_of(config),
        budget_rules=budget_rules(config),
        priority_bounds=priority_bounds_of(config),
        default_estimate_us=int(s.default_estimated_runtime_hours * US_PER_HOUR),
        job_alerts=JobAlertWatch(rules.pending.rules(), idle=rules.job_idle),
        zone=config.ledger.zone(),
        admissions_per_tick=s.admissions_per_tick,
    )
