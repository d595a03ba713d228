"""`tally scheduler run`: the scheduler service (consumes balances and alerts, runs the cycle,
executes with the local executor, publishes decisions on the jobs topic, serves the API and
its Prometheus metrics)."""

from __future__ import annotations

import asyncio
import logging

import click

from tally.cli.help import Group
from tally.cli.logs import configure_logging
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
)
from tally.cli.stack import metrics_port_option, start_metrics
from tally.components import NoBrokerError, bootstrap_servers
from tally.config import ConfigError
from tally.language import _


@click.group(cls=Group)
def scheduler() -> None:
    """The scheduler service."""


@scheduler.command("run")
@config_option
@bootstrap_option
@log_level_option
@log_format_option
@metrics_port_option("scheduler_port")
def run(
    config_path: str,
    bootstrap: str | None,
    log_level: str,
    log_format: str,
    metrics_port: int | None,
) -> None:
    """Run the scheduler: rebuild from the jobs topic, then schedule and serve the API until
    Ctrl-C or SIGTERM (which stop the local jobs it runs)."""
    from scheduler.api import api_server
    from scheduler.errors import BrokerUnavailable, SchedulerError
    from scheduler.service import ServiceStatus, run_service
    from tally.health_http import Heartbeat
    from tally.health_sources import scheduler_probes
    from tally.metrics import TallyMetrics
    from tally.scheduling import (
        api_url,
        build_dispatcher,
        fleet_inventory,
        load_tokens,
        oidc_verifier,
        service_settings,
    )

    config = load_or_exit(config_path)
    try:
        servers = bootstrap_servers(config, bootstrap)
    except NoBrokerError as exc:
        fail(str(exc), Exit.USAGE)
    kafka = kafka_or_exit(config)
    try:
        tokens = load_tokens(config)
    except ConfigError as exc:
        fail(str(exc), Exit.USAGE)
    metrics = TallyMetrics(sections=("scheduler",))
    status, heartbeat = ServiceStatus(), Heartbeat()
    probes = scheduler_probes(status, heartbeat)
    start_metrics(metrics, config, "scheduler_port", metrics_port, "scheduler", probes)
    configure_logging("scheduler", log_level, log_format)
    logger = logging.getLogger("tally.scheduler")
    oidc = oidc_verifier(config)
    if tokens.admin is None and not tokens.teams and not tokens.named and oidc is None:
        logger.warning("no API tokens are configured: every API call will be refused (401)")
    ensure_topics_or_exit(config, servers, kafka)
    settings = service_settings(config, servers, kafka.security)
    inventory = fleet_inventory(config)
    try:
        dispatcher = build_dispatcher(config, inventory=inventory)
    except SchedulerError as exc:
        fail(_("scheduler configuration: {exc}").format(exc=exc), Exit.USAGE)
    serve = api_server(
        tokens, settings.api_host, settings.api_port, settings.max_body_bytes, oidc=oidc
    )

    def ready() -> None:
        logger.info("scheduler ready; API on %s", api_url(config))

    async def main() -> None:
        beating = asyncio.create_task(heartbeat.run())
        try:
            await run_service(
                settings,
                dispatcher,
                serve,
                ready=ready,
                observer=metrics,
                status=status,
                inventory=inventory,
            )
        finally:
            beating.cancel()

    try:
        asyncio.run(main())
    except BrokerUnavailable as exc:
        fail(str(exc), Exit.BROKER)
    except OSError as exc:  # the API's address is taken or not ours
        fail(
            _("cannot serve the API on {url}: {exc}").format(url=api_url(config), exc=exc),
            Exit.USAGE,
        )
