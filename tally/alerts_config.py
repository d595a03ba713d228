"""The `alerts:` section of the configuration: which webhooks idle-GPU alerts go to, validated,
and its translation into the plain settings alert delivery runs on
(`streams.alerts.settings.SinkSettings`).

Delivery (`streams.alerts`) never reads configuration; `tally` hands it `sink_settings(...)`.
A webhook URL (Slack's carries its secret) and header values (an `Authorization`) can come
from environment variables instead (`url_env`, `headers_env`), read by `sink_settings`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, model_validator

from streams.alerts.settings import DEFAULT_GROUP_ID, SinkKind, SinkSettings
from tally.config_fields import ConfigError, EnvName, Name, Strict, secret_from_env


def _url(value: Any) -> str:
    if not isinstance(value, str) or not value.startswith(("http://", "https://")):
        raise ValueError("expected an http:// or https:// URL")
    return value


class AlertSinkConfig(Strict):
    """One webhook. `url` is the Slack (or compatible) incoming-webhook URL, or Alertmanager's
    base URL (`http://host:9093`; Tally posts to `/api/v2/alerts` under it); `url_env` names
    the environment variable holding it instead (give exactly one). `headers_env`: header →
    the variable holding its value (wins over `headers`)."""

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

    @model_validator(mode="after")
    def _one_url(self) -> AlertSinkConfig:
        if (self.url is None) == (self.url_env is None):
            raise ValueError("give exactly one of url or url_env")
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
            except ValueError as exc:
                raise ConfigError(f"{where}.url_env: ${self.url_env}: {exc}") from None
        assert url is not None
        headers = dict(self.headers)
        for header, variable in self.headers_env.items():
            headers[header] = secret_from_env(f"{where}.headers_env.{header}", variable, environ)
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
        )


class AlertsConfig(Strict):
    """The `alerts:` section: where idle-GPU alerts go."""

    sinks: tuple[AlertSinkConfig, ...] = ()
    group_id: Name = DEFAULT_GROUP_ID

    @model_validator(mode="after")
    def _unique_names(self) -> AlertsConfig:
        names = [s.name for s in self.sinks]
        if len(set(names)) != len(names):
            raise ValueError("alert sink names must be unique")
        return self

    def sink_settings(self, environ: Mapping[str, str] | None = None) -> tuple[SinkSettings, ...]:
        """Every sink, as delivery runs it; `ConfigError` for a secret's variable not set."""
        return tuple(sink.settings(environ) for sink in self.sinks)
