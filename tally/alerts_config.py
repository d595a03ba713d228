"""The `alerts:` section of the configuration: which webhooks idle-GPU alerts go to, validated,
and its translation into the plain settings alert delivery runs on
(`streams.alerts.settings.SinkSettings`).

Delivery (`streams.alerts`) never reads configuration; `tally` hands it `sink_settings(...)`.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field, model_validator

from streams.alerts.settings import DEFAULT_GROUP_ID, SinkKind, SinkSettings
from tally.config_fields import Name, Strict


def _url(value: Any) -> str:
    if not isinstance(value, str) or not value.startswith(("http://", "https://")):
        raise ValueError("expected an http:// or https:// URL")
    return value


class AlertSinkConfig(Strict):
    """One webhook. `url` is the Slack (or compatible) incoming-webhook URL, or Alertmanager's
    base URL (`http://host:9093`; Tally posts to `/api/v2/alerts` under it)."""

    name: Name
    kind: SinkKind
    url: Annotated[str, BeforeValidator(_url)]
    timeout_s: float = Field(5.0, gt=0, le=120)
    max_attempts: int = Field(8, ge=1, le=1000)
    backoff_initial_s: float = Field(1.0, gt=0, le=3600)
    backoff_max_s: float = Field(60.0, gt=0, le=3600)
    queue_size: int = Field(1000, ge=1, le=1_000_000)
    headers: dict[str, str] = Field(default_factory=dict)
    resend_interval_s: float = Field(60.0, ge=0, le=86_400)
    dashboard_url: str | None = None

    def settings(self) -> SinkSettings:
        """What delivery needs to know about this sink."""
        return SinkSettings(
            name=self.name,
            kind=self.kind,
            url=self.url,
            timeout_s=self.timeout_s,
            max_attempts=self.max_attempts,
            backoff_initial_s=self.backoff_initial_s,
            backoff_max_s=self.backoff_max_s,
            queue_size=self.queue_size,
            resend_interval_s=self.resend_interval_s,
            headers=dict(self.headers),
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

    def sink_settings(self) -> tuple[SinkSettings, ...]:
        """Every sink, as delivery runs it."""
        return tuple(sink.settings() for sink in self.sinks)
