"""Configuration: one YAML file, validated by pydantic models, loaded in one place.

`load_config(path)` returns a `TallyConfig` or raises `ConfigError` whose message names the file,
the field and what is wrong, e.g.

    deploy/examples/tally.yaml: prices[0].per_gpu_hour: floats are not accepted …

Amounts of money are decimal text ("2.50") and become integer micro-units here (see
`ledger.units.parse_micros`); a YAML float is accepted only if its text has at most six places.
"""

from __future__ import annotations

from datetime import tzinfo
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from ledger.events import MAX_TIME_US
from ledger.idle import IdlePolicy
from ledger.invalid import Invalid
from ledger.periods import DEFAULT_ZONE_NAME, parse_zone
from ledger.pricing import ANY_MODEL, EnergyPrice, Price, PriceBook
from ledger.store.hot_memory import DEFAULT_MEMORY_LIMIT, MIB, parse_size
from tally import config_fields
from tally.alerts_config import AlertsConfig
from tally.approvals_config import ApprovalsConfig
from tally.auth_config import AuthConfig, check_auth_teams
from tally.broker_config import BrokerConfig, TlsConfig, TopicsConfig
from tally.budgets_config import BudgetConfig
from tally.config_errors import format_validation_error
from tally.config_fields import Micros, Name, Strict
from tally.config_yaml import YamlRefused, read_yaml
from tally.identity_config import IdentityConfig, check_identity_names
from tally.inventory_config import InventoryConfig
from tally.language import _
from tally.metrics_config import MetricsConfig
from tally.portal_config import JobTemplateConfig
from tally.scheduler_config import QueueConfig, QuotaConfig, SchedulerConfig
from tally.segments_config import SEGMENTS_URL_PATTERN, ObjectStoreConfig

DEFAULT_DUCKDB_MEMORY_LIMIT: str | None = (
    None if DEFAULT_MEMORY_LIMIT is None else f"{DEFAULT_MEMORY_LIMIT // MIB}MiB"
)
ConfigError = config_fields.ConfigError  # defined beside the field types, which raise it too


class LedgerConfig(Strict):
    data_dir: Path = Path(".tally/data")
    currency: str = Field("USD", pattern=r"^[A-Z]{3}$")
    seal_interval_s: float = Field(5.0, gt=0, le=3600)
    compact_below_rows: int = Field(500_000, ge=1)
    compact_min_segments: int = Field(8, ge=2)
    dedupe_window_days: int = Field(7, ge=1)
    # IANA name; the months and days the books are kept in (`ledger.periods`). Part of the
    # ledger's identity: the worker refuses a ledger kept in another zone (`ledger.store.identity`).
    timezone: str = DEFAULT_ZONE_NAME
    # the writer's DuckDB working memory, e.g. 128MiB or 1GB (null: DuckDB's default, 80 % of
    # the machine's memory); the dedupe index's room is added (`ledger.store.hot_memory`)
    duckdb_memory_limit: str | None = DEFAULT_DUCKDB_MEMORY_LIMIT

    @field_validator("duckdb_memory_limit")
    @classmethod
    def _size(cls, value: str | None) -> str | None:
        if value is not None:
            parse_size(value)  # ValueError: the config error names the field
        return value

    def memory_limit(self) -> int | None:
        """`duckdb_memory_limit` in bytes."""
        return None if self.duckdb_memory_limit is None else parse_size(self.duckdb_memory_limit)

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        parse_zone(value)  # ValueError: the config error names the field
        return value

    def zone(self) -> tzinfo:
        return parse_zone(self.timezone)

    # where sealed segments, the archive and manifests live (None: under data_dir)
    segments_url: str | None = Field(None, pattern=SEGMENTS_URL_PATTERN)
    object_store: ObjectStoreConfig = ObjectStoreConfig()
    # several workers, one ledger: each worker writes one shard per samples partition it is
    # assigned (and the global shard with partition 0), published under `shards/<name>/` of
    # `segments_url` (`streams.shards`); false: one worker writes the whole ledger
    sharded: bool = False

    @model_validator(mode="after")
    def _shards_are_shared(self) -> LedgerConfig:
        if self.sharded and self.segments_url is None:
            raise Invalid(
                "sharded: true needs segments_url: the shards are shared by the workers "
                "through the segments store"
            )
        return self


class TeamConfig(Strict):
    name: Name
    projects: tuple[Name, ...] = Field(min_length=1)
    users: tuple[Name, ...] = ()


class CostCentreConfig(Strict):
    name: Name
    teams: tuple[TeamConfig, ...] = Field(min_length=1)


class OrganisationConfig(Strict):
    cost_centres: tuple[CostCentreConfig, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_teams(self) -> OrganisationConfig:
        seen: set[str] = set()
        for centre in self.cost_centres:
            for team in centre.teams:
                if team.name in seen:
                    raise Invalid("team {team!r} appears twice", team=team.name)
                seen.add(team.name)
        return self

    def teams(self) -> list[TeamConfig]:
        return [team for centre in self.cost_centres for team in centre.teams]

    def cost_centre_of(self) -> dict[str, str]:
        return {team.name: c.name for c in self.cost_centres for team in c.teams}


class WorkloadMix(Strict):
    """Relative weights of the simulated workload shapes."""

    training: int = Field(40, ge=0)
    inference: int = Field(20, ge=0)
    notebook: int = Field(15, ge=0)
    unallocated: int = Field(25, ge=0)

    @model_validator(mode="after")
    def _some_weight(self) -> WorkloadMix:
        if self.training + self.inference + self.notebook + self.unallocated == 0:
            raise Invalid("at least one workload weight must be positive")
        return self


class PoolConfig(Strict):
    name: Name
    model: str = Field(min_length=1, max_length=64)
    nodes: int = Field(ge=1, le=1000)
    gpus_per_node: int = Field(8, ge=1, le=16)
    memory_gib: int = Field(80, ge=1, le=1024)


class WorkloadConfig(Strict):
    """The simulated cluster's jobs (`fleet.workload`): submitted through the scheduler's API
    at `jobs_per_hour` (the weekday-afternoon peak), `external_pct` % of the GPU epochs no job
    holds run an external notebook, and a new ledger gets `history_days` of history sampled
    every `history_interval_s`."""

    jobs_per_hour: int = Field(6, ge=1, le=10_000)
    external_pct: int = Field(15, ge=0, le=100)
    history_days: int = Field(30, ge=0, le=366)
    history_interval_s: int = Field(600, ge=1, le=86_400)


class FleetConfig(Strict):
    """The simulated GPU fleet used when no real GPU source is configured."""

    seed: int = 42
    pools: tuple[PoolConfig, ...] = Field(min_length=1)
    workloads: WorkloadMix = WorkloadMix()
    speed: float = Field(1.0, gt=0, le=1_000_000)
    pack_rounds: int = Field(1, ge=1, le=1000)
    backfill_hours: float = Field(0.0, ge=0, le=24 * 366)
    workload: WorkloadConfig | None = None

    @field_validator("pools")
    @classmethod
    def _unique_pools(cls, pools: tuple[PoolConfig, ...]) -> tuple[PoolConfig, ...]:
        names = [p.name for p in pools]
        if len(set(names)) != len(names):
            raise Invalid("pool names must be unique")
        return pools


class PriceConfig(Strict):
    model: str = Field(min_length=1, max_length=64)
    per_gpu_hour: Micros
    pool: Name | None = None
    effective_from: Annotated[int, Field(ge=0, le=MAX_TIME_US // 1_000_000)] = 0

    @field_validator("per_gpu_hour")
    @classmethod
    def _non_negative(cls, value: int) -> int:
        if value < 0:
            raise Invalid("a price cannot be negative")
        return value


class EnergyPriceConfig(Strict):
    """Energy at this price per kWh (decimal text), from `effective_from` (epoch seconds) on."""

    per_kwh: Micros
    pool: Name | None = None
    effective_from: Annotated[int, Field(ge=0, le=MAX_TIME_US // 1_000_000)] = 0

    @field_validator("per_kwh")
    @classmethod
    def _non_negative(cls, value: int) -> int:
        if value < 0:
            raise Invalid("a price cannot be negative")
        return value


class SamplingConfig(Strict):
    interval_s: float = Field(10.0, ge=1.0, le=3600.0)


class IdleConfig(Strict):
    """Allocated-but-idle detection (see `ledger.idle`)."""

    threshold_pct: int = Field(5, ge=1, le=100)
    min_duration_min: float = Field(30, gt=0, le=7 * 24 * 60)
    resolve_pct: int = Field(10, ge=1, le=100)
    resolve_duration_min: float = Field(5, gt=0, le=24 * 60)

    @model_validator(mode="after")
    def _hysteresis(self) -> IdleConfig:
        if self.resolve_pct < self.threshold_pct:
            raise Invalid("resolve_pct must be at least threshold_pct (hysteresis)")
        return self

    def policy(self) -> IdlePolicy:
        return IdlePolicy(
            threshold_pct=self.threshold_pct,
            min_duration_us=int(self.min_duration_min * 60_000_000),
            resolve_pct=self.resolve_pct,
            resolve_duration_us=int(self.resolve_duration_min * 60_000_000),
        )


class WorkerConfig(Strict):
    """The ledger worker; `ready_max_lag`: `/readyz` holds while the samples consumer is at
    most this many messages behind (see `tally.health`)."""

    group_id: Name = "tally-ledger"
    batch_max_messages: int = Field(2000, ge=1, le=100_000)
    batch_within_s: float = Field(0.25, gt=0, le=60)
    ready_max_lag: int = Field(10_000, ge=0, le=1_000_000_000)


class DashboardConfig(Strict):
    host: str = "127.0.0.1"
    port: int = Field(8501, ge=1, le=65535)
    job_templates: tuple[JobTemplateConfig, ...] = ()  # the portal's saved submissions
    # the language a session starts in (the sidebar switches it); None: the browser's
    language: Literal["en", "zh-CN"] | None = None


class TallyConfig(Strict):
    broker: BrokerConfig = BrokerConfig()
    topics: TopicsConfig = TopicsConfig()
    ledger: LedgerConfig = LedgerConfig()
    organisation: OrganisationConfig
    fleet: FleetConfig
    prices: tuple[PriceConfig, ...] = Field(min_length=1)
    energy_prices: tuple[EnergyPriceConfig, ...] = ()
    sampling: SamplingConfig = SamplingConfig()
    idle: IdleConfig = IdleConfig()
    worker: WorkerConfig = WorkerConfig()
    dashboard: DashboardConfig = DashboardConfig()
    budgets: tuple[BudgetConfig, ...] = ()
    quotas: tuple[QuotaConfig, ...] = ()
    queues: tuple[QueueConfig, ...] = ()
    scheduler: SchedulerConfig = SchedulerConfig()
    alerts: AlertsConfig = AlertsConfig()
    metrics: MetricsConfig = MetricsConfig()
    inventory: InventoryConfig = InventoryConfig()
    identity: IdentityConfig = IdentityConfig()
    auth: AuthConfig = AuthConfig()
    approvals: ApprovalsConfig = ApprovalsConfig()

    @model_validator(mode="after")
    def _identity_names_teams(self) -> TallyConfig:
        check_identity_names(self.identity, {t.name: t.projects for t in self.organisation.teams()})
        return self

    @model_validator(mode="after")
    def _budgets_and_quotas_name_teams(self) -> TallyConfig:
        teams = {t.name for t in self.organisation.teams()}
        seen_budgets: set[tuple[str, str]] = set()
        for budget in self.budgets:
            if budget.team not in teams:
                raise Invalid("budget for unknown team {team!r}", team=budget.team)
            if (budget.team, budget.period or "every") in seen_budgets:
                if budget.period:
                    raise Invalid(
                        "two budgets for team {team!r} in {period}",
                        team=budget.team,
                        period=budget.period,
                    )
                raise Invalid("two budgets for team {team!r} that recur", team=budget.team)
            seen_budgets.add((budget.team, budget.period or "every"))
        seen_quotas: set[tuple[str, str, str]] = set()
        for quota in self.quotas:
            if quota.team not in teams:
                raise Invalid("quota for unknown team {team!r}", team=quota.team)
            key = (quota.team, quota.pool, quota.flavor_model)
            if key in seen_quotas:
                raise Invalid(
                    "two quotas for team {team!r} on {pool}/{model}",
                    team=quota.team,
                    pool=quota.pool,
                    model=quota.flavor_model,
                )
            seen_quotas.add(key)
        return self

    @model_validator(mode="after")
    def _scheduler_names(self) -> TallyConfig:
        teams = {t.name for t in self.organisation.teams()}
        queues = [q.name for q in self.queues]
        if len(set(queues)) != len(queues):
            raise Invalid("queue names must be unique")
        for team in self.scheduler.teams:
            if team.name not in teams:
                raise Invalid("scheduler.teams: unknown team {team!r}", team=team.name)
        for name in self.scheduler.tokens.team_env:
            if name not in teams:
                raise Invalid("scheduler.tokens.team_env: unknown team {team!r}", team=name)
        check_auth_teams(self.auth, dict.fromkeys(teams))
        return self

    @model_validator(mode="after")
    def _queue_models_configured(self) -> TallyConfig:
        """A queue's model policy names only models the config knows (its fleet, quotas and
        prices), and leaves its jobs at least one of them."""
        known = {p.model for p in self.fleet.pools} | {q.model for q in self.quotas}
        known |= {p.model for p in self.prices if p.model != ANY_MODEL}
        for queue in self.queues:
            named = (*(queue.allowed_models or ()), *queue.forbidden_models)
            unknown = sorted({m for m in named if m not in known})
            if unknown:
                raise Invalid(
                    "queue {queue!r}: unknown GPU model(s) {unknown} (configured: {known})",
                    queue=queue.name,
                    unknown=", ".join(unknown),
                    known=", ".join(sorted(known)),
                )
            allowed = set(queue.allowed_models or known) - set(queue.forbidden_models)
            if not allowed:
                raise Invalid("queue {queue!r}: its model policy allows no model", queue=queue.name)
        return self

    @model_validator(mode="after")
    def _fleet_is_priced(self) -> TallyConfig:
        priced = {p.model for p in self.prices}
        if ANY_MODEL in priced:
            return self
        for pool in self.fleet.pools:
            if pool.model not in priced:
                raise Invalid(
                    "fleet pool {pool!r} uses model {model!r}, which has no price",
                    pool=pool.name,
                    model=pool.model,
                )
        return self

    def price_book(self) -> PriceBook:
        return PriceBook(
            tuple(
                Price(p.model, p.per_gpu_hour, p.effective_from * 1_000_000, p.pool)
                for p in self.prices
            ),
            tuple(
                EnergyPrice(e.per_kwh, e.effective_from * 1_000_000, e.pool)
                for e in self.energy_prices
            ),
        )


def parse_config(data: Any, source: str = "<config>", base_dir: Path | None = None) -> TallyConfig:
    """Validate `data` (the file's mapping). Relative paths (`ledger.data_dir`,
    `scheduler.work_dir`, `scheduler.tokens.file`, the `broker.tls` files) resolve against
    `base_dir`; without one
    (a config given as a dict) they stay relative, i.e. to the current directory."""
    if not isinstance(data, dict):
        raise ConfigError(
            _("{source}: the file must hold a mapping of sections (broker, ledger, …)").format(
                source=source
            )
        )
    try:
        config = TallyConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(source, exc)) from None
    if base_dir is None:
        return config
    ledger = config.ledger.model_copy(update={"data_dir": _under(base_dir, config.ledger.data_dir)})
    broker = config.broker
    if broker.tls is not None:
        broker = broker.model_copy(update={"tls": _resolve_tls(broker.tls, base_dir)})
    return config.model_copy(
        update={
            "ledger": ledger,
            "scheduler": _resolve_paths(config.scheduler, base_dir),
            "broker": broker,
        }
    )


def _under(base_dir: Path, path: Path) -> Path:
    return path if path.is_absolute() else (base_dir / path).resolve()


def _resolve_tls(tls: TlsConfig, base_dir: Path) -> TlsConfig:
    files = {"ca_file": tls.ca_file, "cert_file": tls.cert_file, "key_file": tls.key_file}
    return tls.model_copy(
        update={key: _under(base_dir, path) for key, path in files.items() if path is not None}
    )


def _resolve_paths(scheduler: SchedulerConfig, base_dir: Path) -> SchedulerConfig:
    tokens = scheduler.tokens
    if tokens.file is not None:
        tokens = tokens.model_copy(update={"file": _under(base_dir, tokens.file)})
    work_dir = _under(base_dir, scheduler.work_dir)
    return scheduler.model_copy(update={"work_dir": work_dir, "tokens": tokens})


def load_config(path: Path | str, relative_to: Path | None = None) -> TallyConfig:
    """Read and validate a config file. Relative paths in it resolve against `relative_to`
    (default: the directory the file is in), so a config means the same from any directory."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(_("{path}: no such file").format(path=path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            _("{path}: cannot read: {problem}").format(path=path, problem=exc)
        ) from None
    try:
        data = read_yaml(text)
    except YamlRefused as exc:
        raise ConfigError(_("{path}: refused: {problem}").format(path=path, problem=exc)) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc)
        if mark is None:
            said = _("{path}: not valid YAML: {problem}").format(path=path, problem=problem)
        else:
            said = _("{path}: line {line}, column {column}: not valid YAML: {problem}").format(
                path=path, line=mark.line + 1, column=mark.column + 1, problem=problem
            )
        raise ConfigError(said) from None
    return parse_config(data, str(path), (relative_to or path.resolve().parent).resolve())
