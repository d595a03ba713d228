"""`tally collect`: run a collector (NVML, dcgm-exporter or the simulated fleet) and send its
samples to the samples topic and its nodes' inventory reports (`collectors.inventory`) to the
inventory-reports topic, with a disk spool for broker outages and a `/metrics`, `/healthz`,
`/readyz` endpoint."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import orjson

from tally.cli.help import Command
from tally.cli.logs import configure_logging
from tally.cli.options import (
    Exit,
    bootstrap_option,
    config_option,
    fail,
    kafka_or_exit,
    load_or_exit,
    log_format_option,
    log_level_option,
)
from tally.components import NoBrokerError, bootstrap_servers, simulated_fleet
from tally.config import TallyConfig
from tally.language import _

SOURCES = ("auto", "nvml", "dcgm", "sim")


@click.command(cls=Command)
@config_option
@bootstrap_option
@click.option(
    "--source",
    type=click.Choice(SOURCES),
    default="auto",
    show_default=True,
    help="Where samples come from; auto = NVML when a GPU driver answers, else the simulated "
    "fleet.",
)
@click.option("--url", default=None, help="dcgm-exporter /metrics URL (with --source dcgm).")
@click.option(
    "--pool",
    default=None,
    help="Pool of these GPUs (default: inventory.pool of the config, else `default`).",
)
@click.option("--node", default=None, help="Node name (default: this host's name).")
@click.option(
    "--label",
    "labels",
    multiple=True,
    metavar="KEY=VALUE",
    help="A label of this node in the inventory (repeatable; adds to inventory.labels).",
)
@click.option(
    "--interval",
    "interval_s",
    type=click.FloatRange(min=1.0),
    default=None,
    help="Seconds between rounds (default: sampling.interval_s of the config).",
)
@click.option("--once", is_flag=True, help="Print one round of events as JSON and exit.")
@click.option("--rounds", type=click.IntRange(min=1), default=None, help="Stop after N rounds.")
@click.option(
    "--backfill-hours",
    type=click.FloatRange(min=0),
    default=None,
    help="sim: first produce this much history as fast as the broker takes it (default: config).",
)
@click.option(
    "--speed",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="sim: simulated seconds per wall second after the backfill (default: config).",
)
@click.option(
    "--pack-rounds",
    type=click.IntRange(min=1),
    default=None,
    help="sim: rounds packed into one message per GPU while backfilling (default: config).",
)
@click.option(
    "--spool-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Where samples wait while the broker is unreachable (default: <data_dir>/../spool).",
)
@click.option(
    "--spool-max-mib",
    type=click.IntRange(min=1),
    default=256,
    show_default=True,
    help="Spool size bound; when full, the oldest samples are dropped and counted.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(min=0, max=65535),
    default=None,
    help="Serve the collector's /metrics, /healthz and /readyz on this port, 0 for a free one "
    "(default: metrics.collector_port, when set and metrics.enabled).",
)
@click.option(
    "--metrics-host",
    default=None,
    help="Address to serve them on, e.g. 0.0.0.0 for Prometheus on a GPU node (default: "
    "metrics.collector_host, else metrics.host: 127.0.0.1).",
)
@click.option("--basic-auth-user", default=None, help="dcgm: basic-auth user.")
@click.option(
    "--basic-auth-password-env",
    default="TALLY_DCGM_PASSWORD",
    show_default=True,
    help="dcgm: environment variable holding the basic-auth password.",
)
@click.option(
    "--ca-bundle",
    type=click.Path(dir_okay=False),
    default=None,
    help="dcgm: CA bundle to verify the exporter's TLS certificate.",
)
@click.option("--insecure", is_flag=True, help="dcgm: do not verify TLS certificates.")
@click.option(
    "--fake-nvml",
    "fake_nvml",
    type=click.Path(file_okay=False, exists=True),
    default=None,
    hidden=True,
    help="nvml: read a fake NVML driven from this directory (collectors.fake_nvml_files); "
    "for end-to-end tests on hosts without a GPU.",
)
@log_level_option
@log_format_option
def collect(
    config_path: str,
    bootstrap: str | None,
    source: str,
    url: str | None,
    pool: str | None,
    node: str | None,
    labels: tuple[str, ...],
    interval_s: float | None,
    once: bool,
    rounds: int | None,
    backfill_hours: float | None,
    speed: float | None,
    pack_rounds: int | None,
    spool_dir: str | None,
    spool_max_mib: int,
    metrics_port: int | None,
    metrics_host: str | None,
    basic_auth_user: str | None,
    basic_auth_password_env: str,
    ca_bundle: str | None,
    insecure: bool,
    fake_nvml: str | None,
    log_level: str,
    log_format: str,
) -> None:
    """Run a collector and send its samples to the samples topic.

    NVML and dcgm-exporter sample in real time; the simulated fleet can backfill history first.
    While the broker is unreachable, samples go to a disk spool and are replayed in order.
    """
    config = load_or_exit(config_path)
    node_labels = _labels(config, labels)
    pool = pool or config.inventory.pool
    metrics_at = _metrics_address(config, metrics_port, metrics_host)
    configure_logging("collector", log_level, log_format)
    interval = interval_s or config.sampling.interval_s
    node = node or socket.gethostname()
    if fake_nvml is not None and source not in ("auto", "nvml"):
        fail(_("--fake-nvml goes with --source nvml"), Exit.USAGE)
    if fake_nvml is not None:
        source = "nvml"
    if source == "auto":
        source = "nvml" if _nvml_available() else "sim"
        click.echo(_("collecting from {source}").format(source=source), err=True)
    if source == "dcgm" and not url:
        fail(_("--source dcgm needs --url http(s)://host:9400/metrics"), Exit.USAGE)
    if source == "sim":
        _collect_simulated(
            config,
            bootstrap,
            once,
            rounds,
            backfill_hours,
            speed,
            pack_rounds,
            spool_dir,
            spool_max_mib,
            metrics_at,
            node_labels,
        )
        return
    read_round, versions, node_facts = _real_source(
        source,
        config,
        url,
        pool,
        node,
        interval,
        basic_auth_user,
        basic_auth_password_env,
        ca_bundle,
        insecure,
        fake_nvml,
    )
    if once:
        from collectors.runner import sample_source
        from ledger.events import envelope_for, envelope_to_dict

        result = read_round()
        events = [envelope_to_dict(envelope_for(s, sample_source(s))) for s in result.samples]
        click.echo(orjson.dumps(events, option=orjson.OPT_INDENT_2).decode())
        return
    servers = _servers(config, bootstrap)

    async def run(producer: Any, stop: asyncio.Event) -> int:
        from collectors.inventory import InventoryReporter
        from collectors.runner import run_rounds

        loop = asyncio.get_running_loop()
        done = 0

        def read_limited() -> Any:  # runs in run_rounds' worker thread
            nonlocal done
            result = read_round()
            done += 1
            if rounds is not None and done >= rounds:
                loop.call_soon_threadsafe(stop.set)
            return result

        return await run_rounds(
            read_limited,
            producer,
            interval,
            stop,
            health_topic_sender=producer.topic_sender(config.topics.inventory_reports),
            reporter=InventoryReporter(
                producer.topic_sender(config.topics.inventory_reports),
                config.inventory.report_every_rounds,
                node_labels,
                versions,
                node_facts=node_facts,
                gpu_labels=config.inventory.gpu_labels,
            ),
        )

    produced = _with_producer(config, servers, spool_dir, spool_max_mib, metrics_at, run)
    click.echo(
        _("collected {produced} rounds from {source}").format(produced=produced, source=source),
        err=True,
    )


def _labels(config: TallyConfig, options: tuple[str, ...]) -> dict[str, str]:
    """`inventory.labels`, then each `--label KEY=VALUE`."""
    labels = dict(config.inventory.labels)
    for option in options:
        key, sep, value = option.partition("=")
        if not sep or not key or len(key) > 256 or len(value) > 256:
            fail(_("--label {option!r}: expected KEY=VALUE").format(option=option), Exit.USAGE)
        labels[key] = value
    if len(labels) > 64:
        fail(_("at most 64 labels"), Exit.USAGE)
    return labels


def _metrics_address(
    config: TallyConfig, port: int | None, host: str | None
) -> tuple[str, int] | None:
    """Where the collector serves /metrics and its health: the options, else the config."""
    if port is None and config.metrics.enabled:
        port = config.metrics.collector_port
    if port is None:
        return None
    return host or config.metrics.host_of("collector"), port


def _nvml_available() -> bool:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


def _servers(config: TallyConfig, bootstrap: str | None) -> tuple[str, ...]:
    try:
        return bootstrap_servers(config, bootstrap)
    except NoBrokerError as exc:
        fail(str(exc), Exit.USAGE)


def _real_source(
    source: str,
    config: TallyConfig,
    url: str | None,
    pool: str,
    node: str,
    interval: float,
    basic_auth_user: str | None,
    password_env: str,
    ca_bundle: str | None,
    insecure: bool,
    fake_nvml: str | None = None,
) -> tuple[Callable[[], Any], tuple[str | None, str | None], dict[str, Any]]:
    """A function that reads one round from NVML or dcgm-exporter; the driver and CUDA versions
    NVML gives; and what the source says of each node (dcgm-exporter: its labels, the driver
    version, updated by every scrape; NVML: each GPU's topology), for the inventory reports.
    `fake_nvml`: a directory driving `collectors.fake_nvml_files.DirectoryNvml` instead of the
    driver's library."""
    if source == "nvml":
        import pynvml

        from collectors.errors import NvmlUnavailableError
        from collectors.nvml import NvmlCollector
        from tally.components import kubelet_pods, owner_resolver

        nvml: Any = pynvml
        if fake_nvml is not None:
            from collectors.fake_nvml_files import DirectoryNvml

            nvml = DirectoryNvml(Path(fake_nvml))
        resolver = owner_resolver(config, kubelet_pods(config, node))
        collector = NvmlCollector(nvml, node, pool, owner_resolver=resolver, interval_s=interval)
        try:
            collector.start()
        except NvmlUnavailableError as exc:
            fail(str(exc), Exit.USAGE)
        from collectors.inventory import NodeFacts, nvml_versions

        topology = tuple(sorted(collector.topology().items()))
        facts = {node: NodeFacts(topology=topology)}
        return collector.collect_round, nvml_versions(nvml), facts

    from collectors.dcgm import DcgmCollector
    from collectors.dcgm_http import DcgmConfig
    from collectors.errors import DcgmScrapeError
    from collectors.nvml import RoundResult
    from tally.components import kubelet_pods

    auth = None
    if basic_auth_user:
        password = os.environ.get(password_env)
        if password is None:
            fail(
                _("--basic-auth-user needs the password in ${password_env}").format(
                    password_env=password_env
                ),
                Exit.USAGE,
            )
        auth = (basic_auth_user, password)
    assert url is not None
    try:
        dcgm = DcgmCollector(
            DcgmConfig(
                url=url,
                pool=pool,
                node=node,
                scrape_interval_us=int(interval * 1_000_000),
                basic_auth=auth,
                verify=False if insecure else (ca_bundle or True),
                pod_rules=config.identity.kubernetes.rules(),
            ),
            kubelet=kubelet_pods(config, node),
        )
    except ValueError as exc:
        fail(_("--url: {exc}").format(exc=exc), Exit.USAGE)

    def read() -> RoundResult:
        try:
            result = dcgm.scrape()
        except DcgmScrapeError as exc:
            raise RuntimeError(str(exc)) from exc
        problems = tuple(letter.reason for letter in result.dead_letters)
        node_facts.clear()
        node_facts.update(result.nodes)
        return RoundResult(tuple(e.data for e in result.envelopes), result.health, problems)

    node_facts: dict[str, Any] = {}
    return read, (None, None), node_facts


def _with_producer(
    config: TallyConfig,
    servers: tuple[str, ...],
    spool_dir: str | None,
    spool_max_mib: int,
    metrics_at: tuple[str, int] | None,
    body: Callable[[Any, asyncio.Event], Any],
) -> int:
    """Run `body(producer, stop)` with a spooling producer, signal handling, and /metrics,
    /healthz and /readyz at `metrics_at` (host, port)."""
    from collectors.errors import ProducerError, SpoolError
    from collectors.metrics import CollectorMetrics
    from collectors.producer import SampleProducer
    from collectors.spool import Spool
    from tally.health_http import Heartbeat
    from tally.health_sources import collector_probes
    from tally.metrics import MetricsPortError, metrics_url, serve_metrics

    kafka = kafka_or_exit(config)
    metrics = CollectorMetrics()
    directory = Path(spool_dir) if spool_dir else config.ledger.data_dir.parent / "spool"
    try:
        spool = Spool(directory, max_bytes=spool_max_mib << 20)
    except (SpoolError, OSError) as exc:
        fail(
            _("cannot open the spool in {directory}: {exc}").format(directory=directory, exc=exc),
            Exit.USAGE,
        )
    server = None
    heartbeat = Heartbeat()
    if metrics_at is not None:
        host, port = metrics_at
        try:
            server, _thread = serve_metrics(
                metrics.registry, host, port, collector_probes(metrics, heartbeat)
            )
        except MetricsPortError as exc:
            fail(str(exc), Exit.USAGE)
        click.echo(
            _("collector metrics on {url}").format(url=metrics_url(host, server.server_port)),
            err=True,
        )

    async def main() -> int:
        beating = asyncio.create_task(heartbeat.run())
        producer = SampleProducer(
            ",".join(servers),
            config.topics.samples,
            client_id=config.broker.client_id,
            spool=spool,
            metrics=metrics,
            kafka_options=kafka.security,
        )
        await producer.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            return int(await body(producer, stop))
        finally:
            beating.cancel()
            await producer.stop()

    try:
        return asyncio.run(main())
    except ProducerError as exc:
        fail(str(exc), Exit.BROKER)
    finally:
        spool.close()
        if server is not None:
            server.shutdown()
            server.server_close()


def _collect_simulated(
    config: TallyConfig,
    bootstrap: str | None,
    once: bool,
    rounds: int | None,
    backfill_hours: float | None,
    speed: float | None,
    pack_rounds: int | None,
    spool_dir: str | None,
    spool_max_mib: int,
    metrics_at: tuple[str, int] | None,
    labels: dict[str, str],
) -> None:
    from collectors.inventory import InventoryReporter
    from collectors.runner import RunPlan, run_simulated, source_name, wall_clock_us
    from collectors.simulated import align
    from ledger.events import envelope_for, envelope_to_dict

    fleet = simulated_fleet(config)
    if once:
        now = align(wall_clock_us(), fleet.interval_us)
        events = [
            envelope_to_dict(envelope_for(s, source_name(s.node))) for s in fleet.sample_round(now)
        ]
        click.echo(orjson.dumps(events, option=orjson.OPT_INDENT_2).decode())
        return
    servers = _servers(config, bootstrap)
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

    async def run(producer: Any, stop: asyncio.Event) -> int:
        reporter = InventoryReporter(
            producer.topic_sender(config.topics.inventory_reports),
            config.inventory.report_every_rounds,
            labels,
            gpu_labels=config.inventory.gpu_labels,
        )
        if fleet.external_pct is None:
            return await run_simulated(fleet, producer, plan, stop, reporter=reporter)
        # a simulated cluster: meter what the scheduler runs (`collectors.jobs_follower`)
        from collectors.jobs_follower import JobsView, follow_jobs

        security = kafka_or_exit(config).security
        following = asyncio.create_task(
            follow_jobs(JobsView(fleet), ",".join(servers), config.topics.jobs, security, stop)
        )
        try:
            return await run_simulated(fleet, producer, plan, stop, reporter=reporter)
        finally:
            stop.set()
            await following

    produced = _with_producer(config, servers, spool_dir, spool_max_mib, metrics_at, run)
    click.echo(
        _("produced {produced} rounds of {count} GPUs").format(
            produced=produced, count=len(fleet.gpus)
        ),
        err=True,
    )
