"""`tally up`: the embedded stack supervisor.

Starts the broker (embedded tansu unless an external Kafka is configured), creates the topics,
then runs the collector, the ledger worker, the scheduler (local executor against the simulated
fleet's GPUs; its API tokens are created in `scheduler.tokens.file` on first start), the
simulated cluster's job submitter (`workload`, `tally.workload_runner`, when `fleet.workload` is
set; a new ledger first gets the configuration's admin state and the cluster's history,
`tally.history_publish`), the alert
delivery to webhooks (when `alerts.sinks` are configured) and the dashboard as child processes,
each in its own process group. A child that dies is restarted with backoff (at most 5 times a
minute); Ctrl-C or SIGTERM stops every process the stack started (the scheduler stops the jobs
it runs). The dashboard runs as `tally dashboard` would (`dashboard_command`, `ledger_env`).
The ledger data directory outlives the stack; the embedded broker does not (each
start is a new broker incarnation, which the worker recognises).

Metrics (`metrics:`): before anything starts, the metrics ports (worker and scheduler; collector
and alerts when configured) are checked (a port in use raises `tally.metrics.MetricsPortError`)
and a port 0 becomes a free one; each child is given its port (`--metrics-port`), so a
restarted child serves `/metrics`, `/healthz` and `/readyz` where the banner says.

Every child is given `up`'s `--log-level` and `--log-format` (the dashboard only its level, as
Streamlit's `--logger.level`: Streamlit writes its own lines); a data
directory without a ledger gets a new one (the worker creates it), and the banner says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import click

from ledger.pricing import encode_price_book
from ledger.store.layout import has_ledger
from streams.topics import ensure_topic_specs
from tally.broker import EmbeddedBroker
from tally.components import BOOTSTRAP_ENV
from tally.config import TallyConfig
from tally.dashboard_login import login_configured, login_env, portal_env, secrets_path
from tally.kafka_clients import KafkaClients
from tally.metrics import free_port, metrics_url
from tally.metrics_config import MetricsProcess
from tally.scheduling import api_url, ensure_tokens_file
from tally.segments_config import segments_env

MAX_RESTARTS_PER_MINUTE = 5


@dataclass(slots=True)
class Child:
    name: str
    argv: list[str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    restarts: list[float] = field(default_factory=list)


def ledger_env(config: TallyConfig, config_path: Path) -> dict[str, str]:
    """What a child (the dashboard above all) learns of the configuration from its
    environment: the config file, the ledger's directory and currency, the jobs topic, the
    fair-share half-life, the price book (for the FOCUS export's unit prices), the object
    store of the sealed ledger, if any (`tally.segments_config.segments_env`), the dashboard's
    starting language (`dashboard.language`, if set) and, with a
    dashboard login, the claim mapping (`tally.dashboard_login`)."""
    return {
        "TALLY_CONFIG": str(config_path),
        "TALLY_DATA_DIR": str(config.ledger.data_dir.resolve()),
        "TALLY_CURRENCY": config.ledger.currency,
        "TALLY_JOBS_TOPIC": config.topics.jobs,
        "TALLY_FAIR_SHARE_HALF_LIFE_HOURS": str(config.scheduler.fair_share_half_life_hours),
        "TALLY_PRICES": encode_price_book(config.price_book()),
        **(
            {"TALLY_DASHBOARD_LANGUAGE": language}
            if (language := config.dashboard.language)
            else {}
        ),
        **login_env(config),
        **portal_env(config),
    } | segments_env(config.ledger.segments_url, config.ledger.object_store)


def dashboard_command(
    config: TallyConfig,
    host: str | None = None,
    port: int | None = None,
    log_level: str = "info",
) -> list[str]:
    """The command that serves the Streamlit dashboard on `host:port` (default: the config's
    `dashboard:`), headless, logging at `log_level`; it reads the ledger named by `ledger_env`.
    `tally up` runs it as a child, `tally dashboard` in its own place. With a dashboard login
    (`auth.oidc.dashboard`) Streamlit reads the secrets file `write_secrets` wrote."""
    import dashboard

    app = Path(dashboard.__file__).parent / "app.py"
    d = config.dashboard
    return [
        *(sys.executable, "-m", "streamlit", "run", str(app)),
        *("--server.address", host or d.host),
        *("--server.port", str(port or d.port)),
        *("--server.headless", "true"),
        *("--browser.gatherUsageStats", "false"),
        *("--logger.level", log_level),
        *("--client.toolbarMode", "viewer"),  # no developer chrome: no "Deploy" button
        *(("--secrets.files", str(secrets_path(config))) if login_configured(config) else ()),
    ]


class Stack:
    def __init__(
        self,
        config: TallyConfig,
        config_path: Path,
        dashboard: bool = True,
        log_level: str = "info",
        log_format: str = "text",
        kafka: KafkaClients | None = None,
    ) -> None:
        self.config = config
        self.kafka = kafka or KafkaClients()  # the clients' security (plaintext if None)
        self.config_path = config_path
        self.dashboard = dashboard
        self.log_level = log_level
        self.log_format = log_format
        self.new_ledger = not has_ledger(config.ledger.data_dir)
        self.run_dir = config.ledger.data_dir.parent / "run"
        self.broker: EmbeddedBroker | None = None
        self.children: list[Child] = []
        self.metrics_ports: dict[MetricsProcess, int] = {}  # child → its metrics port, fixed
        self._stopping = False

    def _reserve_metrics_ports(self) -> dict[MetricsProcess, int]:
        m = self.config.metrics
        if not m.enabled:
            return {}
        wanted: dict[MetricsProcess, int | None] = {
            "worker": m.worker_port,
            "collector": m.collector_port,
        }
        if self.config.scheduler.enabled:
            wanted["scheduler"] = m.scheduler_port
        if self.config.alerts.sinks:
            wanted["alerts"] = m.alerts_port
        ports: dict[MetricsProcess, int] = {}
        for name, port in wanted.items():
            if port is None:
                continue
            chosen = free_port(m.host_of(name), port)
            while port == 0 and chosen in ports.values():  # two free picks must differ
                chosen = free_port(m.host_of(name), 0)
            ports[name] = chosen
        return ports

    def _metrics_args(self, name: MetricsProcess) -> list[str]:
        port = self.metrics_ports.get(name)
        return [] if port is None else ["--metrics-port", str(port)]

    def _children(self) -> list[Child]:
        py = sys.executable
        cfg = (
            *("--config", str(self.config_path)),
            *("--log-level", self.log_level, "--log-format", self.log_format),
        )
        logs = self.run_dir
        # a simulated cluster's collector never gap-fills: it cannot know what ran then
        cluster = ("--backfill-hours", "0") if self.config.fleet.workload is not None else ()
        children = [
            Child(
                "worker",
                [py, "-m", "tally", "worker", *cfg, *self._metrics_args("worker")],
                logs / "worker.log",
            ),
            Child(
                "collector",
                [py, "-m", "tally", "collect", *cfg, *cluster, *self._metrics_args("collector")],
                logs / "collector.log",
            ),
        ]
        if self.config.scheduler.enabled:
            children.append(
                Child(
                    "scheduler",
                    [
                        *(py, "-m", "tally", "scheduler", "run", *cfg),
                        *self._metrics_args("scheduler"),
                    ],
                    logs / "scheduler.log",
                )
            )
        if self.config.scheduler.enabled and self.config.fleet.workload is not None:
            children.append(
                Child(
                    "workload",
                    [py, "-m", "tally.workload_runner", *cfg],
                    logs / "workload.log",
                )
            )
        if self.config.alerts.sinks:
            children.append(
                Child(
                    "alerts",
                    [
                        *(py, "-m", "tally", "alerts", "run", *cfg),
                        *self._metrics_args("alerts"),
                    ],
                    logs / "alerts.log",
                )
            )
        if self.dashboard:
            command = dashboard_command(self.config, log_level=self.log_level)
            children.append(Child("dashboard", command, logs / "dashboard.log"))
        return children

    def run(self) -> int:
        self.metrics_ports = self._reserve_metrics_ports()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.config.ledger.data_dir.mkdir(parents=True, exist_ok=True)
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        try:
            servers = self._start_broker()
            env = dict(
                os.environ,
                **{BOOTSTRAP_ENV: ",".join(servers)},
                **ledger_env(self.config, self.config_path),
            )
            if self.config.scheduler.enabled:
                ensure_tokens_file(self.config)
            if self.new_ledger and self.config.fleet.workload is not None:
                self._backfill(servers)
            self.children = self._children()
            for child in self.children:
                self._spawn(child, env)
            self._banner(servers)
            return self._supervise(env)
        finally:
            self._stop_all()

    def _start_broker(self) -> tuple[str, ...]:
        topics = self.config.topics
        if self.config.broker.mode == "external":
            servers = self.config.broker.bootstrap_servers
        else:
            click.echo("starting the embedded broker (tansu) …")
            self.broker = EmbeddedBroker(log_path=self.run_dir / "broker.log").start()
            servers = (self.broker.bootstrap,)
        report = asyncio.run(ensure_topic_specs(servers[0], topics.specs(), self.kafka.security))
        for line in report.drift:
            click.secho(
                f"warning: {line} (Tally does not change an existing topic)", fg="yellow", err=True
            )
        return servers

    def _backfill(self, servers: tuple[str, ...]) -> None:
        """A new ledger of a simulated cluster: the admin state and the history first
        (`tally.history_publish`), before the scheduler and the collector start."""
        from tally.history_publish import backfill_history

        workload = self.config.fleet.workload
        days = 0 if workload is None else workload.history_days
        click.echo(f"backfilling {days} days of the simulated cluster's history …")
        now_us = time.time_ns() // 1_000
        done = asyncio.run(backfill_history(self.config, servers, self.kafka.security, now_us))
        click.echo(
            f"  {done.jobs} jobs ({done.job_messages} job events), {done.samples} samples, "
            f"{done.admin_events} admin events in {done.seconds:.0f}s"
        )

    def _spawn(self, child: Child, env: dict[str, str]) -> None:
        with child.log.open("ab") as log:
            child.proc = subprocess.Popen(
                child.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )

    def _banner(self, servers: tuple[str, ...]) -> None:
        d = self.config.dashboard
        click.echo("")
        click.secho("Tally is up.", bold=True)
        if self.dashboard:
            click.echo(f"  dashboard   http://{d.host}:{d.port}")
        click.echo(
            f"  broker      {','.join(servers)} ({'embedded tansu' if self.broker else 'external'})"
        )
        if self.config.scheduler.enabled:
            tokens = self.config.scheduler.tokens.file
            where = f" (tokens in {tokens})" if tokens is not None else ""
            click.echo(f"  scheduler   {api_url(self.config)}{where}")
        for i, (name, port) in enumerate(self.metrics_ports.items()):
            url = metrics_url(self.config.metrics.host_of(name), port)
            click.echo(f"  {'metrics' if i == 0 else '':<11} {url} ({name})")
        new = " (new: there was no ledger; the worker creates it)" if self.new_ledger else ""
        click.echo(f"  ledger      {self.config.ledger.data_dir}{new}")
        click.echo(f"  logs        {self.run_dir}/*.log")
        click.echo(f"  try         tally report cost --by team --config {self.config_path}")
        if self.config.scheduler.enabled and self.config.queues:
            click.echo(
                f"              TALLY_TOKEN=… tally job submit -q {self.config.queues[0].name} "
                f"-p <project> --config {self.config_path} -- nvidia-smi -L"
            )
        click.echo("Press Ctrl-C to stop.")

    def _supervise(self, env: dict[str, str]) -> int:
        while not self._stopping:
            if self.broker is not None and not self.broker.alive():
                click.secho("the embedded broker exited; stopping the stack", fg="red", err=True)
                return 1
            for child in self.children:
                if child.proc is None or child.proc.poll() is None:
                    continue
                now = time.monotonic()
                child.restarts = [t for t in child.restarts if now - t < 60] + [now]
                if len(child.restarts) > MAX_RESTARTS_PER_MINUTE:
                    click.secho(
                        f"{child.name} keeps exiting (see {child.log}); stopping the stack",
                        fg="red",
                        err=True,
                    )
                    return 1
                click.secho(
                    f"{child.name} exited with {child.proc.returncode}; restarting",
                    fg="yellow",
                    err=True,
                )
                time.sleep(min(2 ** len(child.restarts), 10))
                self._spawn(child, env)
            time.sleep(0.5)
        return 0

    def _on_signal(self, signum: int, _frame: object) -> None:
        if not self._stopping:
            click.echo("\nstopping …", err=True)
        self._stopping = True

    def _stop_all(self) -> None:
        running = [c.proc for c in self.children if c.proc is not None and c.proc.poll() is None]
        for proc in running:
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for proc in running:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait()
        if self.broker is not None:
            self.broker.stop()
        click.echo("stopped every process the stack started", err=True)


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
