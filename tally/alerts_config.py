"""The `alerts:` section of the configuration: which webhooks alerts go to, validated,
and its translation into the plain settings alert delivery runs on
(`streams.alerts.settings.SinkSettings`).

Delivery (`streams.alerts`) never reads configuration; `tally` hands it `sink_settings(...)`.
A webhook URL (Slack's carries its secret) and header values (an `Authorization`) can come
from environment variables instead (`url_env`, `headers_env`), read by `sink_settings`; so does
the signing secret of a DingTalk or Feishu robot (`secret_env`: there is no literal form).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import tzinfo
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, model_validator

from ledger.alert_rules import BudgetRules
from ledger.invalid import Invalid
from ledger.units import MS_PER_HOUR, US_PER_SECOND
from scheduler.job_alerts import PendingRules
from streams.alerts.settings import DEFAULT_GROUP_ID, SinkKind, SinkSettings
from streams.alerts.watch import WatchRules
from tally.config_fields import ConfigError, EnvName, Name, Strict, secret_from_env
from tally.language import _, translate

SIGNED_KINDS = frozenset({SinkKind.DINGTALK, SinkKind.FEISHU})


def _url(value: Any) -> str:
    if not isinstance(value, str) or not value.startswith(("http://", "https://")):
        raise Invalid("expected an http:// or https:// URL")
    return value


class AlertSinkConfig(Strict):
    """One webhook. `url` is the Slack (or compatible) incoming-webhook URL, Alertmanager's
    base URL (`http://host:9093`; Tally posts to `/api/v2/alerts` under it), or a robot's
    webhook URL as DingTalk, Feishu/Lark or WeCom gives it (with its `access_token`, hook id or
    `key`); `url_env` names the environment variable holding it instead (give exactly one).
    `headers_env`: header → the variable holding its value (wins over `headers`).
    `secret_env`: the variable holding a DingTalk or Feishu robot's signing secret (its
    "signature" security setting); without it requests are not signed."""

    name: Name
    kind: SinkKind
    url: Annotated[str, BeforeValidator(_url)] | None = None
    url_env: EnvName | None = None
    timeout_s: float = Field(5.0, gt=0, le=120)
    max_attempts: int = Field(8, ge=1, le=1000)
    backoff_initial_s: float = Field(1.0, gt=0, le=3600)
    backoff_max_s: float = Field(60.0, gt=0, le=3600)
    queue_size: int = Field(1000, ge=1, le=1_000_000)
    headers: dict[str, str] = Field(default_factory=dict)
    headers_env: dict[str, EnvName] = Field(default_factory=dict)
    resend_interval_s: float = Field(60.0, ge=0, le=86_400)
    dashboard_url: str | None = None
    secret_env: EnvName | None = None

    @model_validator(mode="after")
    def _one_url(self) -> AlertSinkConfig:
        if (self.url is None) == (self.url_env is None):
            raise Invalid("give exactly one of url or url_env")
        if self.secret_env is not None and self.kind not in SIGNED_KINDS:
            raise Invalid(
                "secret_env: a {kind} sink does not sign its requests", kind=self.kind.value
            )
        return self

    def settings(self, environ: Mapping[str, str] | None = None) -> SinkSettings:
        """What delivery needs to know about this sink, its secrets read from `environ`
        (default: the process's); `ConfigError` names a variable that is not set."""
        where = f"alerts.sinks[{self.name}]"
        url = self.url
        if self.url_env is not None:
            url = secret_from_env(f"{where}.url_env", self.url_env, environ)
            try:
                _url(url)
            except Invalid as exc:
                raise ConfigError(
                    _("{field}: ${variable}: {problem}").format(
                        field=f"{where}.url_env", variable=self.url_env, problem=exc.say(translate)
                    )
                ) from None
        assert url is not None
        headers = dict(self.headers)
        for header, variable in self.headers_env.items():
            headers[header] = secret_from_env(f"{where}.headers_env.{header}", variable, environ)
        secret = None
        if self.secret_env is not None:
            secret = secret_from_env(f"{where}.secret_env", self.secret_env, environ)
        return SinkSettings(
            name=self.name,
            kind=self.kind,
            url=url,
            timeout_s=self.timeout_s,
            max_attempts=self.max_attempts,
            backoff_initial_s=self.backoff_initial_s,
            backoff_max_s=self.backoff_max_s,
            queue_size=self.queue_size,
            resend_interval_s=self.resend_interval_s,
            headers=headers,
            dashboard_url=self.dashboard_url,
            secret=secret,
        )


class BudgetAlertsConfig(Strict):
    """`alerts.rules.budget`: thresholds in percent of a period's budget (each fires once per
    team, period and unit) and the burn-rate forecast."""

    thresholds_pct: tuple[Annotated[int, Field(ge=1, le=1000)], ...] = (50, 80, 100)
    forecast: bool = True
    forecast_after_pct: int = Field(10, ge=0, le=100)

    def rules(self, zone: tzinfo) -> BudgetRules:
        """The rules, for months of `zone` (`ledger.timezone`)."""
        return BudgetRules(self.thresholds_pct, self.forecast, self.forecast_after_pct, zone)


class PendingAlertsConfig(Strict):
    """`alerts.rules.pending`: minutes a job may wait, per queue (`queues`) or for every queue
    (`after_min`); neither: no pending alerts."""

    after_min: int | None = Field(None, ge=1, le=525_600)
    queues: dict[Name, Annotated[int, Field(ge=1, le=525_600)]] = Field(default_factory=dict)

    def rules(self) -> PendingRules:
        after = None if self.after_min is None else self.after_min * 60 * US_PER_SECOND
        return PendingRules(after, {q: m * 60 * US_PER_SECOND for q, m in self.queues.items()})


class AlertRulesConfig(Strict):
    """`alerts.rules`: which alerts besides idle GPUs are raised. `budget: null` turns budget
    alerts off; `team_idle_gpu_hours`: a team's allocated-but-idle GPU-hours in one day (of
    the ledger's time zone) above which it is reported (none: off); `job_idle`: the
    scheduler reports jobs holding GPUs idle past their queue's `idle_reclaim` allowance
    (queues that reclaim or alert)."""

    budget: BudgetAlertsConfig | None = Field(default_factory=BudgetAlertsConfig)
    team_idle_gpu_hours: int | None = Field(None, ge=1, le=1_000_000)
    job_idle: bool = True
    pending: PendingAlertsConfig = Field(default_factory=PendingAlertsConfig)

    def watch_rules(self, zone: tzinfo) -> WatchRules:
        """What `tally alerts run` watches (budgets, in months of `zone`; team idle time, in
        days of `zone`)."""
        idle = self.team_idle_gpu_hours
        return WatchRules(
            self.budget.rules(zone) if self.budget is not None else None,
            None if idle is None else idle * MS_PER_HOUR,
            zone,
        )


class AlertsConfig(Strict):
    """The `alerts:` section: where alerts go, and the rules that raise them."""

    sinks: tuple[AlertSinkConfig, ...] = ()
    group_id: Name = DEFAULT_GROUP_ID
    rules: AlertRulesConfig = Field(default_factory=AlertRulesConfig)

    @model_validator(mode="after")
    def _unique_names(self) -> AlertsConfig:
        names = [s.name for s in self.sinks]
        if len(set(names)) != len(names):
            raise Invalid("alert sink names must be unique")
        return self

    def sink_settings(self, environ: Mapping[str, str] | None = None) -> tuple[SinkSettings, ...]:
        """Every sink, as delivery runs it; `ConfigError` for a secret's variable not set."""
        return tuple(sink.settings(environ) for sink in self.sinks)
