"""Prometheus metrics of the Tally service: its own registry, the metric names, and `/metrics`.

`TallyMetrics` holds a `CollectorRegistry` of its own (never the process-global default), the
helpers the worker, the alert sinks and the scheduler call, and — when given a ledger
directory — gauges read from the newest sealed data at scrape time. It implements the ports
through which the packages report without importing `tally`: `streams.worker.WorkerObserver`,
`scheduler.ports.SchedulerObserver` and `streams.alerts.sinks.DeliveryMetrics`. `sections`
chooses the families a process registers, so an endpoint never shows another process's metrics
as zeros.
`serve_metrics` exposes the registry over HTTP at `/metrics`, with `/healthz` and `/readyz`
(`tally.health_http`) when given the process's probes.

Who serves what (`metrics:` in the config; 0 picks a free port, printed at start):

- `tally worker` on `metrics.worker_port` (9464): the worker families and the ledger gauges
  (the worker is the ledger's one writer, so each ledger is exported once);
- `tally scheduler run` on `metrics.scheduler_port` (9465): the scheduler families;
- `tally alerts run --metrics-port N`: the alert families and the ledger gauges.

Metric names (the contract dashboards and alert rules rely on):

- `tally_idle_gpus{kind}` (gauge; `kind` = `allocated_idle` | `unallocated`): GPUs idle in
  their newest sealed sample (GPUs seen in the last hour of sealed data);
- `tally_gpus_reporting` (gauge): GPUs with a sealed sample in that hour;
- `tally_ledger_newest_sealed_timestamp_seconds` (gauge): end of the newest sealed sample;
- `tally_ledger_lag_seconds` (gauge): now − the newest sealed sample (absent when empty);
- `tally_ledger_segments` (gauge): segments the manifest lists;
- `tally_ledger_readable` (gauge): 1, or 0 when a manifest or a segment is damaged (readers
  refuse it; `tally ledger verify` says what is wrong) — then the gauges above are absent;
- `tally_alert_deliveries_total{sink,kind}` (counter): alerts a webhook accepted (2xx);
- `tally_alert_delivery_failures_total{sink}` (counter): failed tries (each retry counts);
- `tally_alert_drops_total{sink,reason}` (counter; `reason` = `queue_full` | `gave_up` |
  `rejected`): alerts given up for a sink;
- `tally_alert_queue_length{sink}` (gauge): alerts waiting for a sink;
- `tally_alert_sink_up{sink}` (gauge): 1 if the sink's latest try succeeded, else 0;
- `tally_worker_batch_messages`, `tally_worker_batch_postings` (histograms): per batch;
- `tally_worker_commit_seconds` (histogram): time to commit one batch;
- `tally_worker_errors_total{kind}` (counter): worker failures (`commit`: the ledger
  transaction, `broker`: publishing the outbox, `seal`), counted before the failure ends the
  agent (and so the process: the supervisor restarts it); inputs that fail to decode are dead
  letters, not errors;
- `tally_worker_dead_letters_total` (counter): dead letters recorded;
- `tally_worker_seal_failures_total` (counter): seals that failed (a file could not be written,
  the segments volume is full; or a manifest or segment is damaged), each retry counted;
- `tally_worker_sealing_blocked` (gauge): 1 while sealing fails (committed rows wait in the hot
  database, ingest goes on), 0 once a seal succeeds;
- `tally_scheduler_queue_length{queue}` (gauge): jobs pending in the queue (every configured
  queue, 0 when empty; a preempted or retried job waits again);
- `tally_scheduler_admissions_total{queue}`, `tally_scheduler_preemptions_total{queue}`
  (counters): decisions as the scheduler makes them (a restart's replay counts none; idle
  reclaims are not preemptions);
- `tally_scheduler_undeliverable_total` (counter): `jobs` messages the broker refused for their
  content, recorded in the scheduler's `work_dir/undeliverable.jsonl` and never sent again.

A port that cannot be listened on (in use, not an address of this host) raises
`MetricsPortError` at start, an `OSError` whose message says which address and why.
"""

from __future__ import annotations

import errno
import socket
import threading
import time
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ledger.errors import SegmentError
from ledger.read.reports import ReportQueries
from ledger.read.rollups import FleetNow, GpuState, fleet_now, ledger_version
from tally.health_http import Probes, start_server

BATCH_BUCKETS = (1, 10, 50, 100, 250, 500, 1000, 2000, 5000, 10_000, 50_000)
POSTING_BUCKETS = (4, 40, 400, 1000, 4000, 10_000, 40_000, 100_000, 400_000)
COMMIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


_READABLE_HELP = "1 if the sealed ledger can be read; 0 if a manifest or segment is damaged."


class LedgerCollector(Collector):
    """Gauges read from the sealed ledger at scrape time; the idle scan is cached per ledger
    version, so a scrape of an unchanged ledger reads only the manifest."""

    def __init__(self, data_dir: Path | str, clock: Callable[[], float] = time.time) -> None:
        self.data_dir = Path(data_dir)
        self.clock = clock
        self._lock = threading.Lock()
        self._cached: tuple[str, FleetNow, int] | None = None

    def _fleet(self) -> tuple[FleetNow, int]:
        version = ledger_version(self.data_dir)
        with self._lock:
            if self._cached is not None and self._cached[0] == version:
                return self._cached[1], self._cached[2]
            queries = ReportQueries(self.data_dir)
            try:
                now = fleet_now(queries)
                segments = len(queries.segments())
            finally:
                queries.close()
            self._cached = (version, now, segments)
            return now, segments

    def describe(self) -> Iterator[Metric]:
        return iter(())  # collected lazily: registering must not read the ledger

    def collect(self) -> Iterator[Metric]:
        try:
            now, segments = self._fleet()
        except SegmentError:  # damaged: no gauges from it, and the rest of the scrape goes on
            yield GaugeMetricFamily("tally_ledger_readable", _READABLE_HELP, value=0)
            return
        yield GaugeMetricFamily("tally_ledger_readable", _READABLE_HELP, value=1)
        idle = GaugeMetricFamily(
            "tally_idle_gpus",
            "GPUs idle in their newest sealed sample, by kind.",
            labels=["kind"],
        )
        for state in (GpuState.ALLOCATED_IDLE, GpuState.UNALLOCATED):
            idle.add_metric([state.value], now.count(state))
        yield idle
        yield GaugeMetricFamily(
            "tally_gpus_reporting",
            "GPUs with a sealed sample in the last hour of sealed data.",
            value=now.gpus,
        )
        yield GaugeMetricFamily(
            "tally_ledger_segments", "Segments the manifest lists.", value=segments
        )
        if now.as_of_us is not None:
            newest_s = now.as_of_us / 1_000_000
            yield GaugeMetricFamily(
                "tally_ledger_newest_sealed_timestamp_seconds",
                "End of the newest sealed sample, Unix seconds.",
                value=newest_s,
            )
            yield GaugeMetricFamily(
                "tally_ledger_lag_seconds",
                "Seconds between now and the newest sealed sample.",
                value=max(0.0, self.clock() - newest_s),
            )


SECTIONS = ("worker", "scheduler", "alerts")


class TallyMetrics:
    """The service's metrics in a registry of their own; see the module for the ports it
    implements. Families of a section left out of `sections` still take observations (into a
    registry nobody serves), so every helper is always safe to call."""

    def __init__(
        self, data_dir: Path | str | None = None, *, sections: Collection[str] = SECTIONS
    ) -> None:
        unknown = set(sections) - set(SECTIONS)
        if unknown:
            raise ValueError(f"unknown metrics sections: {', '.join(sorted(unknown))}")
        self.registry = CollectorRegistry(auto_describe=True)
        self.sections = frozenset(sections)

        def registry_of(section: str) -> CollectorRegistry:
            return self.registry if section in self.sections else CollectorRegistry()

        r = registry_of("alerts")
        self.alert_deliveries = Counter(
            "tally_alert_deliveries",
            "Alerts a webhook accepted.",
            ["sink", "kind"],
            registry=r,
        )
        self.alert_failures = Counter(
            "tally_alert_delivery_failures",
            "Failed alert delivery tries (each retry counts).",
            ["sink"],
            registry=r,
        )
        self.alert_drops = Counter(
            "tally_alert_drops", "Alerts given up for a sink.", ["sink", "reason"], registry=r
        )
        self.alert_queue_length = Gauge(
            "tally_alert_queue_length", "Alerts waiting for a sink.", ["sink"], registry=r
        )
        self.alert_up = Gauge(
            "tally_alert_sink_up", "1 if the sink's latest try succeeded.", ["sink"], registry=r
        )
        r = registry_of("worker")
        self.batch_messages = Histogram(
            "tally_worker_batch_messages",
            "Messages per ledger-worker batch.",
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.batch_postings = Histogram(
            "tally_worker_batch_postings",
            "Postings committed per batch.",
            buckets=POSTING_BUCKETS,
            registry=r,
        )
        self.commit_seconds = Histogram(
            "tally_worker_commit_seconds",
            "Time to commit one batch.",
            buckets=COMMIT_BUCKETS,
            registry=r,
        )
        self.worker_errors = Counter(
            "tally_worker_errors", "Worker errors by kind.", ["kind"], registry=r
        )
        self.dead_letters = Counter(
            "tally_worker_dead_letters", "Dead letters recorded.", registry=r
        )
        self.seal_failures = Counter(
            "tally_worker_seal_failures",
            "Seals that failed (a file could not be written, or the sealed ledger is damaged).",
            registry=r,
        )
        self.sealing_blocked_gauge = Gauge(
            "tally_worker_sealing_blocked",
            "1 while sealing fails and committed rows wait in the hot database.",
            registry=r,
        )
        self.undeliverable_messages = Counter(
            "tally_worker_undeliverable",
            "Outbox messages the broker refused for their content, kept as undeliverable.",
            ["topic"],
            registry=r,
        )
        r = registry_of("scheduler")
        self.scheduler_queue = Gauge(
            "tally_scheduler_queue_length", "Jobs waiting per queue.", ["queue"], registry=r
        )
        self.scheduler_admissions = Counter(
            "tally_scheduler_admissions", "Jobs admitted.", ["queue"], registry=r
        )
        self.scheduler_preemptions = Counter(
            "tally_scheduler_preemptions", "Jobs preempted.", ["queue"], registry=r
        )
        self.scheduler_undeliverable_messages = Counter(
            "tally_scheduler_undeliverable",
            "Jobs-topic messages the broker refused for their content, recorded as undeliverable.",
            registry=r,
        )
        self.ledger: LedgerCollector | None = None
        if data_dir is not None:
            self.ledger = LedgerCollector(data_dir)
            self.registry.register(self.ledger)

    # ---------------------------------------------------------------- the worker

    def observe_batch(self, messages: int, postings: int, commit_seconds: float) -> None:
        """One committed batch of the ledger worker."""
        self.batch_messages.observe(messages)
        self.batch_postings.observe(postings)
        self.commit_seconds.observe(commit_seconds)

    def worker_error(self, kind: str) -> None:
        self.worker_errors.labels(kind=kind).inc()

    def dead_letter(self, count: int = 1) -> None:
        self.dead_letters.inc(count)

    def undeliverable(self, topic: str, count: int = 1) -> None:
        self.undeliverable_messages.labels(topic=topic).inc(count)

    def seal_failed(self) -> None:
        self.seal_failures.inc()

    def sealing_blocked(self, blocked: bool) -> None:
        self.sealing_blocked_gauge.set(1 if blocked else 0)

    # ---------------------------------------------------------------- the scheduler

    def scheduler_queue_length(self, queue: str, length: int) -> None:
        self.scheduler_queue.labels(queue=queue).set(length)

    def scheduler_undeliverable(self, count: int) -> None:
        self.scheduler_undeliverable_messages.inc(count)

    def admitted(self, queue: str, count: int = 1) -> None:
        self.scheduler_admissions.labels(queue=queue).inc(count)

    def preempted(self, queue: str, count: int = 1) -> None:
        self.scheduler_preemptions.labels(queue=queue).inc(count)

    # ---------------------------------------------------------------- alert sinks

    def alert_delivered(self, sink: str, kind: str) -> None:
        self.alert_deliveries.labels(sink=sink, kind=kind).inc()

    def alert_failed(self, sink: str) -> None:
        self.alert_failures.labels(sink=sink).inc()

    def alert_dropped(self, sink: str, reason: str) -> None:
        self.alert_drops.labels(sink=sink, reason=str(reason)).inc()

    def alert_queue(self, sink: str, length: int) -> None:
        self.alert_queue_length.labels(sink=sink).set(length)

    def alert_sink_up(self, sink: str, up: bool) -> None:
        self.alert_up.labels(sink=sink).set(1 if up else 0)


class MetricsPortError(OSError):
    """The metrics endpoint cannot listen on its address; the message says which and why."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.errno = code


def metrics_url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}/metrics" if ":" in host else f"http://{host}:{port}/metrics"


def _port_error(host: str, port: int, exc: OSError) -> MetricsPortError:
    if exc.errno == errno.EADDRINUSE:
        why = "the port is already in use"
    elif exc.errno == errno.EADDRNOTAVAIL:
        why = f"{host} is not an address of this host"
    elif exc.errno == errno.EACCES:
        why = "the port needs privileges this process lacks"
    else:
        why = exc.strerror or str(exc)
    return MetricsPortError(f"cannot serve metrics on {host}:{port}: {why}", exc.errno)


def serve_metrics(
    metrics: TallyMetrics | CollectorRegistry,
    host: str = "127.0.0.1",
    port: int = 9464,
    probes: Probes | None = None,
) -> tuple[WSGIServer, threading.Thread]:
    """Serve `metrics` (or any registry) at `http://host:port/metrics`, and `probes` at
    `/healthz` and `/readyz`, from a daemon thread; `server.shutdown()` stops it. Port 0 picks a
    free port (`server.server_port`). Raises `MetricsPortError`."""
    registry = metrics.registry if isinstance(metrics, TallyMetrics) else metrics
    try:
        return start_server(registry, host, port, probes)
    except socket.gaierror as exc:
        raise MetricsPortError(f"cannot serve metrics on {host}:{port}: {exc}") from None
    except OSError as exc:
        raise _port_error(host, port, exc) from None


def free_port(host: str, port: int = 0) -> int:
    """`port` if it can be listened on at `host` now (0: a port the system picks), as the
    metrics server binds it; raises `MetricsPortError` if not. The port is released on
    return, so a process started next can take it (a race only another process can lose)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise MetricsPortError(f"cannot serve metrics on {host}:{port}: {exc}") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as HTTPServer binds
        try:
            sock.bind(address)
        except OSError as exc:
            raise _port_error(host, port, exc) from None
        bound: int = sock.getsockname()[1]
        return bound
