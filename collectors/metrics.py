"""The collector's own health, as Prometheus metrics on a `/metrics` endpoint.

This module owns the metric names and their meaning; `tally.metrics.serve_metrics` serves the
registry over HTTP with the health routes (`tally collect --metrics-port`). Every
collector has its own `CollectorRegistry`, so several collectors (or tests) in one process never
share counts. Counters only go up; what a sample became adds up:

    samples_read = samples_sent + samples_spooled + (samples still buffered)
    samples_spooled = samples_replayed + samples_dropped{reason in spool reasons} + spool_samples
"""

from __future__ import annotations

from enum import StrEnum

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

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
