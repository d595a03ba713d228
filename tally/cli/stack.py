"""`tally up` and `tally worker`: the whole stack, and the ledger worker on its own; and how a
service command starts its Prometheus and health endpoint (`start_metrics`, shared with the
scheduler)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import click

from ledger.errors import LedgerError
from streams.kafka import BrokerError
from tally.cli.options import (
    Exit,
    bootstrap_option,
    config_option,
    fail,
    load_or_exit,
)
from tally.components import NoBrokerError, bootstrap_servers, worker_settings
from tally.config import ConfigError

if TYPE_CHECKING:
    from tally.config import TallyConfig
    from tally.health_http import Probes
    from tally.metrics import TallyMetrics


MetricsPortKey = Literal["worker_port", "scheduler_port"]


def metrics_port_option(
    key: MetricsPortKey,
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    return click.option(
        "--metrics-port",
        type=click.IntRange(0, 65535),
        default=None,
        help=f"Serve Prometheus metrics at /metrics (and /healthz, /readyz) on this port, 0 for "
        f"a free one (default: metrics.{key}, when metrics.enabled).",
    )


def start_metrics(
    metrics: TallyMetrics,
    config: TallyConfig,
    key: MetricsPortKey,
    port: int | None,
    who: str,
    probes: Probes | None = None,
) -> None:
    """Serve `metrics` (and `probes` at /healthz, /readyz) on `port` (None: the config's
    `metrics.<key>`, if enabled) at `metrics.<process>_host` and say where; a port that cannot
    be listened on ends the command with `Exit.USAGE`, before anything else starts."""
    from tally.metrics import MetricsPortError, metrics_url, serve_metrics

    section = config.metrics
    process: Literal["worker", "scheduler"] = "worker" if key == "worker_port" else "scheduler"
    if port is None:
        if not section.enabled:
            return
        port = section.worker_port if key == "worker_port" else section.scheduler_port
    host = section.host_of(process)
    try:
        server, _ = serve_metrics(metrics, host, port, probes)
    except MetricsPortError as exc:
        fail(f"{exc} (metrics.{key} or --metrics-port; 0 picks a free port)", Exit.USAGE)
    click.echo(f"{who} metrics at {metrics_url(host, server.server_port)}", err=True)


@click.command()
@config_option
@click.option("--no-dashboard", is_flag=True, help="Do not start the Streamlit dashboard.")
def up(config_path: str, no_dashboard: bool) -> None:
    """Run the whole stack: broker, collector, worker and dashboard, until Ctrl-C."""
    from tally.metrics import MetricsPortError
    from tally.stack import Stack

    config = load_or_exit(config_path)
    try:
        config.alerts.sink_settings()  # every secret's variable is set, before anything starts
    except ConfigError as exc:
        fail(str(exc), Exit.USAGE)
    stack = Stack(config, Path(config_path).resolve(), dashboard=not no_dashboard)
    try:
        code = stack.run()
    except BrokerError as exc:
        fail(str(exc), Exit.BROKER)
    except MetricsPortError as exc:
        fail(f"{exc} (see metrics: in {config_path}; 0 picks a free port)", Exit.USAGE)
    sys.exit(code)


@click.command()
@config_option
@bootstrap_option
@click.option(
    "--log-level",
    type=click.Choice(["crit", "error", "warn", "info", "debug"]),
    default="warn",
    show_default=True,
)
@metrics_port_option("worker_port")
def worker(
    config_path: str, bootstrap: str | None, log_level: str, metrics_port: int | None
) -> None:
    """Run the ledger worker: consume samples, commit postings, seal segments."""
    import logging

    from streams.kafka import ensure_topics
    from streams.worker import LedgerWorker
    from tally.health_sources import WorkerHealth
    from tally.metrics import TallyMetrics

    config = load_or_exit(config_path)
    try:
        servers = bootstrap_servers(config, bootstrap)
    except NoBrokerError as exc:
        fail(str(exc), Exit.USAGE)
    metrics = TallyMetrics(config.ledger.data_dir, sections=("worker",))
    health = WorkerHealth(config.worker.ready_max_lag)
    start_metrics(metrics, config, "worker_port", metrics_port, "worker", health.probes())
    try:
        asyncio.run(
            ensure_topics(
                servers[0],
                list(config.topics.all().values()),
                config.topics.partitions,
                compacted=config.topics.compacted(),
            )
        )
    except BrokerError as exc:
        fail(str(exc), Exit.BROKER)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s worker %(levelname)s %(message)s"))
    logger = logging.getLogger("tally.worker")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        ledger_worker = LedgerWorker(worker_settings(config, servers), observer=metrics)
        health.attach(ledger_worker)
        ledger_worker.run(loglevel=log_level)
    except LedgerError as exc:
        fail(str(exc), Exit.LEDGER)
