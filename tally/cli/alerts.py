"""`tally alerts …`: deliver alerts to the configured webhooks (and watch budgets and idle
time for the alerts they raise), or test the webhooks."""

from __future__ import annotations

import asyncio
import signal
import sys

import click

from tally.alerts_config import AlertsConfig
from tally.cli.help import Group
from tally.cli.logs import configure_logging
from tally.cli.options import (
    Exit,
    bootstrap_option,
    config_option,
    fail,
    kafka_or_exit,
    log_format_option,
    log_level_option,
    said,
)
from tally.config import ConfigError, TallyConfig, load_config
from tally.language import _


def _load(config_path: str) -> tuple[TallyConfig, AlertsConfig]:
    """The configuration and its `alerts:` section; a usage error names file and field."""
    try:
        config = load_config(config_path)
        config.alerts.sink_settings()  # every secret's variable is set
    except ConfigError as exc:
        fail(str(exc), Exit.USAGE)
    return config, config.alerts


@click.group(cls=Group)
def alerts() -> None:
    """Alerts to webhooks (Slack, Alertmanager, DingTalk, Feishu/Lark, WeCom)."""


@alerts.command()
@config_option
def test(config_path: str) -> None:
    """Send a test alert to every configured sink and report each one (exit 1 if any failed)."""
    from streams.alerts.probe import send_test

    config, section = _load(config_path)
    if not section.sinks:
        fail(
            _("{config_path}: alerts.sinks: no alert sinks are configured").format(
                config_path=config_path
            ),
            Exit.USAGE,
        )
    failed = 0
    for sink in section.sink_settings():
        result = send_test(sink, config.ledger.currency)
        if result.ok:
            click.echo(f"ok      {sink.name} ({sink.kind.value}): {result.detail}")
        else:
            failed += 1
            tries = f" after {result.attempts} tries" if result.attempts > 1 else ""
            click.secho(
                f"FAILED  {sink.name} ({sink.kind.value}){tries}: {result.detail}",
                fg="red",
            )
    if failed:
        click.echo(
            _("{failed} of {count} sinks failed").format(failed=failed, count=len(section.sinks)),
            err=True,
        )
        sys.exit(int(Exit.CHECK_FAILED))


@alerts.command()
@config_option
@bootstrap_option
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Serve Prometheus metrics at /metrics (and /healthz, /readyz) on this port, 0 for a "
    "free one (default: metrics.alerts_port, when set and metrics.enabled).",
)
@click.option(
    "--metrics-host",
    default=None,
    help="Address to serve them on (default: metrics.alerts_host, else metrics.host).",
)
@log_level_option
@log_format_option
def run(
    config_path: str,
    bootstrap: str | None,
    metrics_port: int | None,
    metrics_host: str | None,
    log_level: str,
    log_format: str,
) -> None:
    """Deliver alerts from the alerts topic to every sink until Ctrl-C; also watch the
    balances and alerts topics for budget burn and teams' daily idle GPU time (alerts.rules).

    Deliveries are deduplicated by alert id across restarts (the log is under the ledger data
    directory); a sink that is down never holds up the others.
    """
    from streams.alerts.consumer import consume_alerts
    from streams.alerts.dispatcher import AlertDispatcher
    from streams.alerts.watch import AlertWatch, run_watch
    from streams.kafka import BrokerError, wait_for_broker
    from streams.progress import ConsumerProgress
    from tally.components import NoBrokerError, bootstrap_servers
    from tally.health_http import Heartbeat
    from tally.health_sources import alerts_probes
    from tally.metrics import MetricsPortError, TallyMetrics, metrics_url, serve_metrics

    config, section = _load(config_path)
    if not section.sinks:
        fail(
            _("{config_path}: alerts.sinks: no alert sinks are configured").format(
                config_path=config_path
            ),
            Exit.USAGE,
        )
    try:
        servers = bootstrap_servers(config, bootstrap)
    except NoBrokerError as exc:
        fail(str(exc), Exit.USAGE)
    configure_logging("alerts", log_level, log_format)
    kafka = kafka_or_exit(config)
    metrics = TallyMetrics(sections=("alerts",))  # its own figures: the ledger is not on its volume
    progress, heartbeat = ConsumerProgress(), Heartbeat()
    if metrics_port is None and config.metrics.enabled:
        metrics_port = config.metrics.alerts_port
    if metrics_port is not None:
        host = metrics_host or config.metrics.host_of("alerts")
        try:
            server, _thread = serve_metrics(
                metrics, host, metrics_port, alerts_probes(progress, heartbeat)
            )
        except MetricsPortError as exc:
            fail(_("{exc} (metrics.alerts_port or --metrics-port)").format(exc=exc), Exit.USAGE)
        click.echo(
            _("metrics at {url}").format(url=metrics_url(host, server.server_port)), err=True
        )
    dispatcher = AlertDispatcher(
        section.sink_settings(), config.ledger.data_dir, config.ledger.currency, metrics
    ).start()
    names = ", ".join(f"{s.name} ({s.kind.value})" for s in section.sinks)
    click.echo(
        _("delivering alerts from {alerts} to {names}").format(
            alerts=config.topics.alerts, names=names
        ),
        err=True,
    )

    async def main() -> None:
        beating = asyncio.create_task(heartbeat.run())
        await wait_for_broker(servers[0], options=kafka.security)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        rules = section.rules.watch_rules(config.ledger.zone())
        tasks = [
            consume_alerts(
                servers,
                config.topics.alerts,
                dispatcher,
                section.group_id,
                stop=stop,
                progress=progress,
                kafka_options=kafka.security,
                group_options=kafka.group,
            )
        ]
        if rules.enabled:
            watch = AlertWatch(rules)
            tasks.append(
                run_watch(servers, config.topics.balances, config.topics.alerts, watch, stop)
            )
        try:
            await asyncio.gather(*tasks)
        finally:
            stop.set()
            beating.cancel()

    try:
        asyncio.run(main())
    except BrokerError as exc:
        fail(said(exc), Exit.BROKER)
    finally:
        dispatcher.stop()
