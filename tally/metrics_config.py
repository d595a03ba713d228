"""The `metrics:` section of the configuration: where each long-running process serves
`/metrics`, `/healthz` and `/readyz` (see `tally.metrics`, `tally.health`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from ledger.invalid import Invalid
from tally.config_fields import Strict

MetricsProcess = Literal["worker", "scheduler", "collector", "alerts"]


class MetricsConfig(Strict):
    """Prometheus `/metrics`, `/healthz` and `/readyz` of each long-running process (see
    `tally.metrics`, `tally.health`); port 0 picks a free port at start. A port already in use
    stops the process at start. `host` is every process's bind address unless its own
    `<process>_host` is set (e.g. `collector_host: 0.0.0.0` on a GPU node, for Prometheus);
    the collector and alert delivery serve only when their port is set (or `--metrics-port`)."""

    enabled: bool = True
    host: str = Field("127.0.0.1", min_length=1)
    worker_host: str | None = Field(None, min_length=1)
    scheduler_host: str | None = Field(None, min_length=1)
    collector_host: str | None = Field(None, min_length=1)
    alerts_host: str | None = Field(None, min_length=1)
    worker_port: int = Field(9464, ge=0, le=65535)
    scheduler_port: int = Field(9465, ge=0, le=65535)
    collector_port: int | None = Field(None, ge=0, le=65535)
    alerts_port: int | None = Field(None, ge=0, le=65535)

    @model_validator(mode="after")
    def _distinct_ports(self) -> MetricsConfig:
        seen: dict[int, str] = {}
        for process in ("worker", "scheduler", "collector", "alerts"):
            port = self.port_of(process)
            if not port:
                continue
            if port in seen:
                raise Invalid(
                    "{first}_port and {second}_port must differ (or be 0)",
                    first=seen[port],
                    second=process,
                )
            seen[port] = process
        return self

    def host_of(self, process: MetricsProcess) -> str:
        """The address `process` serves its metrics and health endpoints on."""
        own: str | None = getattr(self, f"{process}_host")
        return own or self.host

    def port_of(self, process: MetricsProcess) -> int | None:
        """The port `process` serves on (None: it does not serve unless told to)."""
        port: int | None = getattr(self, f"{process}_port")
        return port
