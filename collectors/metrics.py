"""The collector's own health, as Prometheus metrics on a `/metrics` endpoint.

This module owns the metric names, their meaning, and the HTTP server that exposes them. Every
collector has its own `CollectorRegistry`, so several collectors (or tests) in one process never
share counts. Counters only go up; what a sample became adds up:

    samples_read = samples_sent + samples_spooled + (samples still buffered)
    samples_spooled = samples_replayed + samples_dropped{reason in spool reasons} + spool_samples

The server is prometheus_client's WSGI server on its own daemon thread, bound to 127.0.0.1 by
default; `MetricsServer.stop()` shuts it down and frees the port. A bind failure is translated
here into `MetricsError`, the one exception this module raises.
"""

from __future__ import annotations

import threading
from enum import StrEnum
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import start_http_server

from collectors.errors import MetricsError

NAMESPACE = "tally_collector"


class ErrorKind(StrEnum):
    """The `kind` label of `tally_collector_errors_total`."""

    READ = "read"  # reading a round raised
    CONNECT = "connect"  # the producer could not (re)connect to the broker
    SEND = "send"  # the broker did not acknowledge a flush in time, or refused it
    SPOOL = "spool"  # the spool could not be written or read
    SPOOL_RECOVERY = "spool_recovery"  # a torn or corrupt tail was cut when the spool opened


class CollectorMetrics:
    """The collector's counters and gauges, in a registry of their own."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        n = NAMESPACE
        self.rounds = Counter(f"{n}_rounds", "Sampling rounds read.", registry=r)
        self.samples_read = Counter(f"{n}_samples_read", "Samples read from GPUs.", registry=r)
        self.samples_sent = Counter(
            f"{n}_samples_sent", "Samples the broker acknowledged on first send.", registry=r
        )
        self.samples_spooled = Counter(
            f"{n}_samples_spooled", "Samples written to the disk spool.", registry=r
        )
        self.samples_replayed = Counter(
            f"{n}_samples_replayed",
            "Spooled samples the broker acknowledged on replay.",
            registry=r,
        )
        self.samples_dropped = Counter(
            f"{n}_samples_dropped",
            "Samples lost without reaching the broker, by reason.",
            ["reason"],
            registry=r,
        )
        self.health_events = Counter(
            f"{n}_health_events", "GPU health events sent to the alerts topic.", registry=r
        )
        self.errors = Counter(f"{n}_errors", "Errors by kind.", ["kind"], registry=r)
        self.spool_bytes = Gauge(
            f"{n}_spool_bytes", "Bytes of records waiting in the spool.", registry=r
        )
        self.spool_records = Gauge(
            f"{n}_spool_records", "Records (messages) waiting in the spool.", registry=r
        )
        self.spool_samples = Gauge(
            f"{n}_spool_samples", "Samples waiting in the spool.", registry=r
        )
        self.broker_up = Gauge(
            f"{n}_broker_up", "1 while the producer is connected to the broker.", registry=r
        )
        self.producer_idempotent = Gauge(
            f"{n}_producer_idempotent",
            "1 when the producer runs with idempotence, 0 when the broker refused it.",
            registry=r,
        )
        self.last_round_time = Gauge(
            f"{n}_last_round_timestamp_seconds",
            "When the last round was read (Unix time).",
            registry=r,
        )
        for kind in ErrorKind:
            self.errors.labels(kind=kind.value)

    def error(self, kind: ErrorKind) -> None:
        self.errors.labels(kind=kind.value).inc()

    def value(self, name: str, **labels: str) -> float:
        """The current value of one sample (`..._total` for counters); 0 when absent."""
        found = self.registry.get_sample_value(f"{NAMESPACE}_{name}", labels)
        return 0.0 if found is None else found

    def render(self) -> bytes:
        """The text exposition of every metric, as `/metrics` serves it."""
        return generate_latest(self.registry)


class MetricsServer:
    """`/metrics` of one `CollectorMetrics` over HTTP; port 0 picks a free port."""

    def __init__(self, metrics: CollectorMetrics, port: int, addr: str = "127.0.0.1") -> None:
        self.metrics = metrics
        self.addr = addr
        self.port = port
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> MetricsServer:
        try:
            server, thread = start_http_server(
                self.port, addr=self.addr, registry=self.metrics.registry
            )
        except OSError as exc:
            raise MetricsError(
                f"cannot serve collector metrics on {self.addr}:{self.port}: {exc}"
            ) from exc
        self._server, self._thread = server, thread
        self.port = int(server.server_address[1])
        return self

    @property
    def url(self) -> str:
        return f"http://{self.addr}:{self.port}/metrics"

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None

    def __enter__(self) -> MetricsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
