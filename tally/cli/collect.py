"""`tally collect`: run a collector and send its samples to the samples topic."""

from __future__ import annotations

import asyncio

import click
import orjson

from tally.cli.options import (
    Exit,
    bootstrap_option,
    config_option,
    fail,
    load_or_exit,
)
from tally.components import NoBrokerError, bootstrap_servers, simulated_fleet


@click.command()
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

    config = load_or_exit(config_path)
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
