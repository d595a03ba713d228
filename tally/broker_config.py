"""The `broker:` and `topics:` sections of the configuration: where Kafka is, how every client
authenticates (SASL) and encrypts (TLS), the consumer group timeouts, and the replication and
retention of each topic Tally creates.

The models only validate; `tally.kafka_clients` turns them into what the Kafka clients take
(reading the SASL password and TLS key password from their `*_env` variables, building the
TLS context) and `TopicsConfig.specs` into the topics `streams.topics.ensure_topic_specs`
creates and checks.

Retention by topic, and why:

- `jobs` and `admin` are kept forever (`retention.ms=-1`, `retention.bytes=-1`, deleting
  nothing). They are not compacted: the scheduler replays every event of `jobs` at start (a
  job's `JobSubmitted` and its later `JobStarted`/`JobFinished` share its key, so compaction
  would keep only the last and lose the job), and `tally ledger rebuild --from topics` folds
  every admin event (a team's price or budget changes share a key too).
- `balances` is compacted: each message is an account's whole current balance, so the latest
  per key is all a reader needs.
- `samples`, `alerts` and `deadletter` are kept for a bounded time: the ledger keeps what it
  consumed from `samples` in its archive, alerts matter while they are current, and dead
  letters are also in the store's `dead_letters` table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from ledger.invalid import Invalid
from streams.topics import TopicSpec
from tally.config_fields import EnvName, Name, Strict

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
TopicKey = Literal[
    "samples", "jobs", "admin", "balances", "alerts", "deadletter", "inventory_reports", "inventory"
]
MS_PER_HOUR = 3_600_000


class SaslConfig(Strict):
    """SASL credentials: the password is read from the environment variable `password_env`."""

    mechanism: SaslMechanism = "SCRAM-SHA-512"
    username: str = Field(min_length=1, max_length=256)
    password_env: EnvName


class TlsConfig(Strict):
    """TLS of the connections to the brokers. `ca_file`: the CA bundle that signed the brokers'
    certificates (default: the system's); `cert_file` and `key_file`: a client certificate for
    mutual TLS (`key_file` may be left out when `cert_file` holds the key too), its key's
    password in `key_password_env`; `check_hostname`: whether the broker's certificate must
    name the host connected to."""

    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    key_password_env: EnvName | None = None
    check_hostname: bool = True

    @model_validator(mode="after")
    def _key_needs_cert(self) -> TlsConfig:
        if self.cert_file is None and self.key_file is not None:
            raise Invalid("key_file needs cert_file (the client certificate)")
        if self.cert_file is None and self.key_password_env is not None:
            raise Invalid("key_password_env needs cert_file (the client certificate)")
        return self


class ConsumerConfig(Strict):
    """Timeouts of every consumer in a group (the worker's Faust app and samples consumer, alert
    delivery). The defaults suit the embedded broker (tansu delays a group's first join by half
    the session timeout); a production cluster may want a longer session. `rebalance_timeout_s`
    defaults to the session timeout; `request_timeout_s` to each library's own default."""

    session_timeout_s: float = Field(6.0, ge=1, le=1800)
    heartbeat_interval_s: float = Field(1.0, gt=0, le=600)
    rebalance_timeout_s: float | None = Field(None, ge=1, le=1800)
    request_timeout_s: float | None = Field(None, ge=1, le=3600)

    @model_validator(mode="after")
    def _heartbeat_within_session(self) -> ConsumerConfig:
        if self.heartbeat_interval_s >= self.session_timeout_s:
            raise Invalid(
                "heartbeat_interval_s ({heartbeat}) must be below session_timeout_s "
                "({session}); a third of it is usual",
                heartbeat=self.heartbeat_interval_s,
                session=self.session_timeout_s,
            )
        return self


class BrokerConfig(Strict):
    """Where Kafka is: `embedded` starts tansu on a free loopback port (plaintext; needs the
    `embedded` extra); `external` uses yours, with `security_protocol`, `sasl` and `tls`."""

    mode: Literal["embedded", "external"] = "embedded"
    bootstrap_servers: tuple[str, ...] = ()
    client_id: str = "tally"
    security_protocol: SecurityProtocol = "PLAINTEXT"
    sasl: SaslConfig | None = None
    tls: TlsConfig | None = None
    consumer: ConsumerConfig = ConsumerConfig()

    @model_validator(mode="after")
    def _external_needs_servers(self) -> BrokerConfig:
        if self.mode == "external" and not self.bootstrap_servers:
            raise Invalid("an external broker needs bootstrap_servers (host:port, …)")
        for server in self.bootstrap_servers:
            host, sep, port = server.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise Invalid("bootstrap server {server!r} is not host:port", server=server)
        return self

    @model_validator(mode="after")
    def _security_fits_protocol(self) -> BrokerConfig:
        protocol = self.security_protocol
        if self.mode == "embedded" and protocol != "PLAINTEXT":
            raise Invalid(
                "security_protocol: the embedded broker speaks PLAINTEXT only, not {protocol} "
                "(use mode: external for a secured cluster)",
                protocol=protocol,
            )
        sasl = protocol.startswith("SASL_")
        if sasl and self.sasl is None:
            raise Invalid(
                "sasl: security_protocol {protocol} needs a sasl: section", protocol=protocol
            )
        if not sasl and self.sasl is not None:
            raise Invalid(
                "sasl: given, but security_protocol is {protocol} "
                "(SASL_PLAINTEXT or SASL_SSL use it)",
                protocol=protocol,
            )
        if self.tls is not None and not protocol.endswith("SSL"):
            raise Invalid(
                "tls: given, but security_protocol is {protocol} (SSL or SASL_SSL use it)",
                protocol=protocol,
            )
        return self


class TopicSettings(Strict):
    """A topic's replication, overriding the `topics:` defaults."""

    replication_factor: int | None = Field(None, ge=1, le=32)
    min_insync_replicas: int | None = Field(None, ge=1, le=32)


class RetentionConfig(Strict):
    """How long the time-bounded topics keep messages (hours). `jobs` and `admin` are kept
    forever and `balances` compacted, by design (see the module docstring)."""

    samples_hours: float = Field(7 * 24, gt=0, le=100 * 366 * 24)
    alerts_hours: float = Field(7 * 24, gt=0, le=100 * 366 * 24)
    deadletter_hours: float = Field(30 * 24, gt=0, le=100 * 366 * 24)


class TopicsConfig(Strict):
    """The topics Tally creates: names, partitions, replication (`replication_factor`,
    `min_insync_replicas`; 1 suits the embedded broker, 3 and 2 a production cluster; `settings`
    overrides them per topic) and retention."""

    samples: Name = "tally.samples"
    jobs: Name = "tally.jobs"
    admin: Name = "tally.admin"
    balances: Name = "tally.balances"
    alerts: Name = "tally.alerts"
    deadletter: Name = "tally.deadletter"
    inventory_reports: Name = "tally.inventory-reports"
    inventory: Name = "tally.inventory"
    partitions: int = Field(8, ge=1, le=256)
    replication_factor: int = Field(1, ge=1, le=32)
    min_insync_replicas: int = Field(1, ge=1, le=32)
    retention: RetentionConfig = RetentionConfig()
    settings: dict[TopicKey, TopicSettings] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _insync_within_replicas(self) -> TopicsConfig:
        for key in self.all():
            replicas, insync = self.replication_of(key)
            if insync > replicas:
                where = f"settings.{key}" if key in self.settings else "topics"
                raise Invalid(
                    "{where}: min_insync_replicas ({insync}) exceeds replication_factor "
                    "({replicas}) for the {key} topic: no write could ever succeed",
                    where=where,
                    insync=insync,
                    replicas=replicas,
                    key=key,
                )
        return self

    def all(self) -> dict[str, str]:
        return {
            "samples": self.samples,
            "jobs": self.jobs,
            "admin": self.admin,
            "balances": self.balances,
            "alerts": self.alerts,
            "deadletter": self.deadletter,
            "inventory_reports": self.inventory_reports,
            "inventory": self.inventory,
        }

    def compacted(self) -> list[str]:
        """The topics whose newest message per key is all that matters."""
        return [self.balances, self.inventory]

    def replication_of(self, key: str) -> tuple[int, int]:
        """(replication factor, min.insync.replicas) of the topic `key` (samples, jobs, …)."""
        own = self.settings.get(key)  # type: ignore[call-overload]
        replicas = own.replication_factor if own and own.replication_factor else None
        insync = own.min_insync_replicas if own and own.min_insync_replicas else None
        return replicas or self.replication_factor, insync or self.min_insync_replicas

    def specs(self) -> tuple[TopicSpec, ...]:
        """Each topic as `streams.topics.ensure_topic_specs` creates it and checks it."""
        kept_forever = {"retention.ms": "-1", "retention.bytes": "-1", "cleanup.policy": "delete"}
        r = self.retention
        configs: dict[str, dict[str, str]] = {
            "samples": _time_bounded(r.samples_hours),
            "jobs": kept_forever,
            "admin": kept_forever,
            "balances": {"cleanup.policy": "compact"},
            "alerts": _time_bounded(r.alerts_hours),
            "deadletter": _time_bounded(r.deadletter_hours),
            # a node's reports: the worker folds and archives them, the newest one counts
            "inventory_reports": _time_bounded(r.samples_hours),
            "inventory": {"cleanup.policy": "compact"},
        }
        specs = []
        for key, name in self.all().items():
            replicas, insync = self.replication_of(key)
            topic_configs = dict(configs[key], **{"min.insync.replicas": str(insync)})
            specs.append(TopicSpec(name, self.partitions, replicas, topic_configs))
        return tuple(specs)


def _time_bounded(hours: float) -> dict[str, str]:
    return {"retention.ms": str(int(hours * MS_PER_HOUR)), "cleanup.policy": "delete"}
