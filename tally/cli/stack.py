"""`tally up` and `tally worker`: the whole stack, and the ledger worker on its own."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

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


@click.command()
@config_option
@click.option("--no-dashboard", is_flag=True, help="Do not start the Streamlit dashboard.")
def up(config_path: str, no_dashboard: bool) -> None:
    """Run the whole stack: broker, collector, worker and dashboard, until Ctrl-C."""
    from tally.stack import Stack

    config = load_or_exit(config_path)
    stack = Stack(config, Path(config_path).resolve(), dashboard=not no_dashboard)
    try:
        code = stack.run()
    except BrokerError as exc:
        fail(str(exc), Exit.BROKER)
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
def worker(config_path: str, bootstrap: str | None, log_level: str) -> None:
    """Run the ledger worker: consume samples, commit postings, seal segments."""
    import logging

    from streams.kafka import ensure_topics
    from streams.worker import LedgerWorker

    config = load_or_exit(config_path)
    try:
        servers = bootstrap_servers(config, bootstrap)
    except NoBrokerError as exc:
        fail(str(exc), Exit.USAGE)
    try:
        asyncio.run(
            ensure_topics(
                servers[0],
                list(config.topics.all().values()),
                config.topics.partitions,
                compacted=[config.topics.balances],
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
        LedgerWorker(worker_settings(config, servers)).run(loglevel=log_level)
    except LedgerError as exc:
        fail(str(exc), Exit.LEDGER)
