"""The scheduler's part of the configuration: quotas (per pool, model and MIG profile), queues
(class, priorities, idle reclaim, model policy), the scheduler service's settings (its teams'
cohorts and overdrafts, where API tokens come from, the Slurm executor). Loaded with the rest
by `tally.config`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from ledger.fractional import MIG_SEP, mig_model, valid_profile
from ledger.invalid import Invalid
from tally.config_fields import EnvName, GpuMs, Micros, Name, Strict


class QuotaConfig(Strict):
    """A team's GPU quota in a pool and model; a limit left out is unlimited. With
    `mig_profile`, the quota counts MIG instances of that profile on GPUs of `model` (a flavor
    of its own, `<model>/<profile>`), apart from whole GPUs of the model."""

    team: Name
    pool: Name
    model: str = Field(min_length=1, max_length=64)
    mig_profile: str | None = Field(None, min_length=1, max_length=32)
    nominal: int = Field(ge=0, le=1_000_000)
    borrowing_limit: int | None = Field(None, ge=0, le=1_000_000)
    lending_limit: int | None = Field(None, ge=0, le=1_000_000)

    @model_validator(mode="after")
    def _profile(self) -> QuotaConfig:
        if self.mig_profile is not None and not valid_profile(self.mig_profile):
            raise Invalid(
                "mig_profile {profile!r}: expected e.g. 1g.10gb or 3g.40gb",
                profile=self.mig_profile,
            )
        if MIG_SEP in self.model:
            raise Invalid("model {model!r}: name a MIG profile in mig_profile", model=self.model)
        return self

    @property
    def flavor_model(self) -> str:
        """The model the scheduler counts this quota in (`A100/1g.10gb` for MIG)."""
        return self.model if self.mig_profile is None else mig_model(self.model, self.mig_profile)


QueueClassName = Literal["training", "inference", "dev"]
ModelName = Annotated[str, Field(min_length=1, max_length=64)]


class IdleReclaimAfter(Strict):
    """`{reclaim_after_min: N}` or `{alert_after_min: N}`: act once every GPU of a job has been
    allocated but idle this long."""

    reclaim_after_min: float | None = Field(None, ge=0, le=366 * 24 * 60)
    alert_after_min: float | None = Field(None, ge=0, le=366 * 24 * 60)

    @model_validator(mode="after")
    def _one(self) -> IdleReclaimAfter:
        if (self.reclaim_after_min is None) == (self.alert_after_min is None):
            raise Invalid("give exactly one of reclaim_after_min or alert_after_min")
        return self


class PriorityBoundsConfig(Strict):
    """`{min: A, max: B}`: the job priorities a team's token may ask for in a queue (inclusive;
    the admin's token may ask for any)."""

    min: int = Field(0, ge=-1_000_000, le=1_000_000)
    max: int = Field(100, ge=-1_000_000, le=1_000_000)

    @model_validator(mode="after")
    def _ordered(self) -> PriorityBoundsConfig:
        if self.min > self.max:
            raise Invalid("min ({min}) is above max ({max})", min=self.min, max=self.max)
        return self


class QueueConfig(Strict):
    """A scheduler queue. `idle_reclaim` left out takes the class's default (dev: reclaim after
    60 min, training: alert after 60 min, inference: never). `priority` is the priority of jobs
    that name none; `priority_bounds` the priorities a team's token may name (default 0–100).
    `allowed_models` (left out: every model) and `forbidden_models` are the queue's model
    policy: the GPU models its jobs may be placed on (e.g. dev never on H100)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    name: Name
    queue_class: QueueClassName = Field(alias="class")
    priority: int = Field(0, ge=-1_000_000, le=1_000_000)
    priority_bounds: PriorityBoundsConfig = PriorityBoundsConfig()
    preemptible: bool = True
    idle_reclaim: Literal["alert", "never"] | IdleReclaimAfter | None = None
    max_runtime_hours: float | None = Field(None, gt=0, le=366 * 24)
    retry_limit: int = Field(0, ge=0, le=100)
    run_preemptible_when_over_budget: bool = False
    allowed_models: tuple[ModelName, ...] | None = Field(None, min_length=1)
    forbidden_models: tuple[ModelName, ...] = ()

    @model_validator(mode="after")
    def _over_budget_needs_preemptible(self) -> QueueConfig:
        if self.run_preemptible_when_over_budget and not self.preemptible:
            raise Invalid(
                "run_preemptible_when_over_budget needs a preemptible queue "
                "(over-budget jobs run preemptible)"
            )
        return self


class SchedulerTeamConfig(Strict):
    """Scheduler settings of one team: the cohort it lends to and borrows from, its fair-share
    weight (default: its nominal GPUs) and how far below zero admission may take its budget."""

    name: Name
    cohort: Name | None = None
    weight: int | None = Field(None, ge=1, le=1_000_000)
    overdraft_money: Micros = 0
    overdraft_gpu_hours: GpuMs = 0

    @field_validator("overdraft_money")
    @classmethod
    def _non_negative(cls, value: int) -> int:
        if value < 0:
            raise Invalid("an overdraft cannot be negative")
        return value


class TokensConfig(Strict):
    """Where the API's bearer tokens come from — never the configuration file itself.

    `file`: a YAML file `{admin: TOKEN, teams: {TEAM: TOKEN, …}, tokens: [{name, token, role,
    team, user}, …]}` (keep it mode 0600): the admin token is the `admin` role, a team's token
    that team's `team-lead`, `tokens:` names tokens of any role (`ledger.roles`);
    `admin_env` and `team_env` (team → variable name): environment variables, which win over
    the file. A team without a token cannot use the API.
    """

    file: Path | None = None
    admin_env: EnvName | None = "TALLY_ADMIN_TOKEN"
    team_env: dict[Name, EnvName] = Field(default_factory=dict)


class SlurmConfig(Strict):
    """How the Slurm executor submits: partition, whether Tally's node choice is pinned
    (`--nodelist`; node names must then match the fleet's), extra `sbatch` arguments, and the
    shards each GPU has in Slurm's sharding gres (GPU shares ask for `--gres=shard:n`)."""

    partition: str | None = Field(None, min_length=1, max_length=64)
    pin_nodes: bool = False
    extra_args: tuple[str, ...] = ()
    shards_per_gpu: int | None = Field(None, ge=1, le=1000)  # Slurm's shard gres per GPU


class SchedulerConfig(Strict):
    """The scheduler service (`tally scheduler run`, a child of `tally up`)."""

    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = Field(8600, ge=1, le=65535)
    cycle_interval_s: float = Field(2.0, ge=0.05, le=3600)
    fair_share_half_life_hours: float = Field(168.0, gt=0, le=366 * 24)
    default_estimated_runtime_hours: float = Field(1.0, gt=0, le=366 * 24)
    executor: Literal["local", "slurm"] = "local"
    slurm: SlurmConfig = SlurmConfig()
    work_dir: Path = Path(".tally/scheduler")
    max_body_kib: int = Field(64, ge=1, le=16_384)
    heads_per_queue: int = Field(8, ge=1, le=10_000)
    admissions_per_tick: int = Field(256, ge=1, le=1_000_000)
    gil_switch_interval_us: int = Field(500, ge=50, le=100_000)  # `scheduler.interpreter`
    tokens: TokensConfig = TokensConfig()
    teams: tuple[SchedulerTeamConfig, ...] = ()

    @field_validator("teams")
    @classmethod
    def _unique_teams(
        cls, teams: tuple[SchedulerTeamConfig, ...]
    ) -> tuple[SchedulerTeamConfig, ...]:
        names = [t.name for t in teams]
        if len(set(names)) != len(names):
            raise Invalid("a team appears twice")
        return teams
