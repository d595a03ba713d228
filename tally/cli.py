"""The `tally` command line.

Exit codes (stable; scripts may rely on them):
    0  success
    1  a check failed (e.g. `tally ledger verify` found problems)
    2  bad usage or an invalid configuration file
    3  the broker could not be reached
    4  the ledger could not be read or written
  130  interrupted (Ctrl-C)
"""

from __future__ import annotations

import asyncio
import sys
import time
from enum import IntEnum
from pathlib import Path
from typing import Any, NoReturn

import click
import orjson

from ledger.errors import LedgerError
from ledger.queries import DIMENSIONS, LedgerQueries, Period
from ledger.units import format_micros
from ledger.verify import verify_ledger
from streams.kafka import BrokerError
from tally.components import NoBrokerError, bootstrap_servers, simulated_fleet, worker_settings
from tally.config import ConfigError, TallyConfig, load_config
from tally.output import OutputFormat, render

DEFAULT_CONFIG = "deploy/examples/tally.yaml"


class Exit(IntEnum):
    OK = 0
    CHECK_FAILED = 1
    USAGE = 2
    BROKER = 3
    LEDGER = 4
    INTERRUPTED = 130


def fail(message: str, code: Exit) -> NoReturn:
    click.secho(f"error: {message}", fg="red", err=True)
    sys.exit(int(code))


def _load(path: str) -> TallyConfig:
    try:
        return load_config(path)
    except ConfigError as exc:
        fail(str(exc), Exit.USAGE)


def _data_dir(config_path: str | None, data_dir: str | None) -> Path:
    if data_dir:
        return Path(data_dir)
    return _load(config_path or DEFAULT_CONFIG).ledger.data_dir


config_option = click.option(
    "--config",
    "-c",
    "config_path",
    envvar="TALLY_CONFIG",
    default=DEFAULT_CONFIG,
    show_default=True,
    type=click.Path(dir_okay=False),
    help="Tally configuration file.",
)
bootstrap_option = click.option(
    "--bootstrap",
    envvar="TALLY_BOOTSTRAP",
    default=None,
    metavar="HOST:PORT[,…]",
    help="Kafka bootstrap servers (default: from the config; set by `tally up`).",
)
data_dir_option = click.option(
    "--data-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Ledger data directory (default: the config's ledger.data_dir).",
)
output_option = click.option(
    "--output",
    "-o",
    type=click.Choice([f.value for f in OutputFormat]),
    default="table",
    show_default=True,
    help="Output format.",
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="tally")
def cli() -> None:
    """Tally: an event-sourced GPU accounting ledger, its collectors, worker and dashboards."""


# ---------------------------------------------------------------------------------- stack


@cli.command()
@config_option
@click.option("--no-dashboard", is_flag=True, help="Do not start the Streamlit dashboard.")
def up(config_path: str, no_dashboard: bool) -> None:
    """Run the whole stack: broker, collector, worker and dashboard, until Ctrl-C."""
    from tally.stack import Stack

    config = _load(config_path)
    stack = Stack(config, Path(config_path).resolve(), dashboard=not no_dashboard)
    try:
        code = stack.run()
    except BrokerError as exc:
        fail(str(exc), Exit.BROKER)
    sys.exit(code)


@cli.command()
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

    config = _load(config_path)
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


@cli.command()
@config_option
@bootstrap_option
@click.option(
    "--source",
    type=click.Choice(["sim"]),
    default="sim",
    show_default=True,
    help="Where samples come from.",
)
@click.option("--once", is_flag=True, help="Print one round of events as JSON and exit.")
@click.option("--rounds", type=click.IntRange(min=1), default=None, help="Stop after N rounds.")
@click.option(
    "--backfill-hours",
    type=click.FloatRange(min=0),
    default=None,
    help="First produce this much history as fast as the broker takes it (default: config).",
)
@click.option(
    "--speed",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Simulated seconds per wall second after the backfill (default: config).",
)
@click.option(
    "--pack-rounds",
    type=click.IntRange(min=1),
    default=None,
    help="Rounds packed into one message per GPU while backfilling (default: config).",
)
def collect(
    config_path: str,
    bootstrap: str | None,
    source: str,
    once: bool,
    rounds: int | None,
    backfill_hours: float | None,
    speed: float | None,
    pack_rounds: int | None,
) -> None:
    """Run a collector and send its samples to the samples topic."""
    from collectors.producer import ProducerError, SampleProducer
    from collectors.runner import RunPlan, run_simulated, source_name, wall_clock_us
    from collectors.simulated import align
    from ledger.events import envelope_for, envelope_to_dict

    config = _load(config_path)
    fleet = simulated_fleet(config)
    if once:
        now = align(wall_clock_us(), fleet.interval_us)
        events = [
            envelope_to_dict(envelope_for(s, source_name(s.node))) for s in fleet.sample_round(now)
        ]
        click.echo(orjson.dumps(events, option=orjson.OPT_INDENT_2).decode())
        return
    try:
        servers = bootstrap_servers(config, bootstrap)
    except NoBrokerError as exc:
        fail(str(exc), Exit.USAGE)
    plan = RunPlan(
        start_us=wall_clock_us(),
        backfill_us=int(
            (config.fleet.backfill_hours if backfill_hours is None else backfill_hours)
            * 3_600_000_000
        ),
        speed=speed or config.fleet.speed,
        pack_rounds=pack_rounds or config.fleet.pack_rounds,
        max_rounds=rounds,
    )

    async def main() -> int:
        producer = SampleProducer(
            ",".join(servers), config.topics.samples, client_id=config.broker.client_id
        )
        await producer.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        import signal

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            return await run_simulated(fleet, producer, plan, stop)
        finally:
            await producer.stop()

    try:
        produced = asyncio.run(main())
    except ProducerError as exc:
        fail(str(exc), Exit.BROKER)
    click.echo(f"produced {produced} rounds of {len(fleet.gpus)} GPUs", err=True)


# ---------------------------------------------------------------------------------- ledger


@cli.group()
def ledger() -> None:
    """Inspect and maintain the ledger."""


@ledger.command()
@config_option
@data_dir_option
@output_option
def verify(config_path: str, data_dir: str | None, output: str) -> None:
    """Check zero-sum, segment integrity, and that no offset range is missing or doubled."""
    directory = _data_dir(config_path, data_dir)
    bar: Any = None

    def progress(done: int, total: int) -> None:
        nonlocal bar
        if bar is None and sys.stderr.isatty() and total > 20:
            bar = click.progressbar(length=total, label="verifying segments", file=sys.stderr)
            bar.__enter__()
        if bar is not None:
            bar.update(1)

    report = verify_ledger(directory, progress)
    if bar is not None:
        bar.__exit__(None, None, None)
    if output == OutputFormat.JSON:
        click.echo(
            orjson.dumps(
                {
                    "ok": report.ok,
                    "segments": report.segments,
                    "rows": report.rows,
                    "transactions": report.transactions,
                    "problems": list(report.problems),
                },
                option=orjson.OPT_INDENT_2,
            ).decode()
        )
    else:
        click.echo(
            f"{report.segments} segments, {report.rows} postings, "
            f"{report.transactions} transactions"
        )
        for problem in report.problems:
            click.secho(f"problem: {problem}", fg="red")
        click.echo("ledger OK" if report.ok else f"{len(report.problems)} problem(s) found")
    sys.exit(int(Exit.OK if report.ok else Exit.CHECK_FAILED))


@ledger.command()
@config_option
@data_dir_option
def seal(config_path: str, data_dir: str | None) -> None:
    """Seal committed rows into Parquet segments now (the worker must not be running)."""
    from ledger.store import LedgerStore

    directory = _data_dir(config_path, data_dir)
    try:
        with LedgerStore(directory) as store:
            result = store.seal()
    except LedgerError as exc:
        fail(str(exc), Exit.LEDGER)
    click.echo(f"sealed {len(result.sealed)} segments, compacted into {len(result.compacted)}")


# ---------------------------------------------------------------------------------- reports


@cli.group()
def report() -> None:
    """Reports over the sealed ledger."""


@report.command()
@config_option
@data_dir_option
@click.option(
    "--by",
    "by",
    default="team",
    show_default=True,
    help=f"Comma-separated dimensions: {', '.join(DIMENSIONS)}.",
)
@click.option("--period", default=None, metavar="YYYY-MM", help="Only this month (UTC).")
@click.option("--include-unallocated", is_flag=True, help="Add the cost of unallocated GPUs.")
@output_option
def cost(
    config_path: str,
    data_dir: str | None,
    by: str,
    period: str | None,
    include_unallocated: bool,
    output: str,
) -> None:
    """GPU-hours and cost grouped by team, project, user, job, model or pool."""
    dims = [d.strip() for d in by.split(",") if d.strip()]
    unknown = [d for d in dims if d not in DIMENSIONS]
    if unknown or not dims:
        fail(
            f"--by: unknown dimension {', '.join(unknown) or '(none)'}; "
            f"choose from {', '.join(DIMENSIONS)}",
            Exit.USAGE,
        )
    try:
        chosen = Period.month(period) if period else None
    except ValueError as exc:
        fail(f"--period: {exc}", Exit.USAGE)
    directory = _data_dir(config_path, data_dir)
    try:
        rows = LedgerQueries(directory).cost_by(dims, chosen, include_unallocated)
    except LedgerError as exc:
        fail(str(exc), Exit.LEDGER)
    fmt = OutputFormat(output)
    headers = [*dims, "gpu_hours", "cost"]
    table = [
        [
            *r.keys,
            f"{r.gpu_ms / 3_600_000:.3f}",
            format_micros(r.money_micros, 6 if fmt is not OutputFormat.TABLE else 2),
        ]
        for r in rows
    ]
    if not table and fmt is OutputFormat.TABLE:
        click.echo("no sealed usage in the ledger for this selection")
        return
    click.echo(render(headers, table, fmt))


# ---------------------------------------------------------------------------------- config


@cli.group()
def config() -> None:
    """Configuration files."""


@config.command()
@click.argument("path", type=click.Path(dir_okay=False))
def check(path: str) -> None:
    """Validate a configuration file; print what is wrong, field by field."""
    cfg = _load(path)
    gpus = sum(p.nodes * p.gpus_per_node for p in cfg.fleet.pools)
    click.echo(
        f"{path}: OK ({len(cfg.organisation.teams())} teams, {gpus} simulated GPUs, "
        f"{len(cfg.prices)} prices, broker {cfg.broker.mode})"
    )


def main() -> None:
    started = time.monotonic()
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("interrupted", err=True)
        sys.exit(int(Exit.INTERRUPTED))
    except click.ClickException as exc:
        exc.show()
        sys.exit(int(Exit.USAGE))
    except KeyboardInterrupt:
        click.echo(f"interrupted after {time.monotonic() - started:.0f}s", err=True)
        sys.exit(int(Exit.INTERRUPTED))
