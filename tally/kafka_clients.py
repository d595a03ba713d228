"""The one place the `broker:` section becomes what Kafka clients take.

`kafka_clients(config)` returns `KafkaClients`: the aiokafka keywords every producer, consumer
and admin client of Tally is built with (`security_protocol`, `ssl_context`, `sasl_mechanism`,
`sasl_plain_username`, `sasl_plain_password`), the group consumers' timeouts, and, for the
worker's Faust app, the same security as Faust's `broker_credentials` (`faust_credentials`;
the worker turns the group timeouts into Faust's `broker_*` settings,
`streams.worker_settings.faust_group_options`). The packages that hold the clients (`collectors`,
`scheduler`, `streams`) take these as plain mappings.

Secrets are read here, when a command is about to connect: the SASL password from
`broker.sasl.password_env`, the client key's password from `broker.tls.key_password_env`. A
variable not set, or a TLS file that cannot be read, is a `ConfigError` naming the field.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from streams.kafka import DEFAULT_GROUP_OPTIONS
from tally.broker_config import BrokerConfig, TlsConfig
from tally.config_fields import ConfigError, secret_from_env
from tally.language import _


@dataclass(frozen=True, slots=True)
class KafkaClients:
    """What every Kafka client of a process is built with."""

    security: Mapping[str, Any] = field(default_factory=dict)  # every aiokafka client
    group: Mapping[str, int] = field(default_factory=lambda: DEFAULT_GROUP_OPTIONS)

    def faust_credentials(self) -> Any:
        """Faust's `broker_credentials` for the same security (None: plaintext). Imports
        Faust: call it only where the worker runs."""
        import faust

        protocol = self.security.get("security_protocol", "PLAINTEXT")
        context = self.security.get("ssl_context")
        if protocol.startswith("SASL_"):
            return faust.SASLCredentials(
                username=self.security["sasl_plain_username"],
                password=self.security["sasl_plain_password"],
                mechanism=self.security["sasl_mechanism"],
                ssl_context=context if protocol == "SASL_SSL" else None,
            )
        if protocol == "SSL":
            return faust.SSLCredentials(context)
        return None


def kafka_clients(broker: BrokerConfig, environ: Mapping[str, str] | None = None) -> KafkaClients:
    """The client settings of `broker`, its secrets read from `environ` (default: the
    process's environment); `ConfigError` naming the field for a secret not set or a TLS file
    that cannot be used."""
    security: dict[str, Any] = {"security_protocol": broker.security_protocol}
    if broker.security_protocol in ("SSL", "SASL_SSL"):
        security["ssl_context"] = ssl_context(broker.tls or TlsConfig(), environ)
    if broker.sasl is not None:
        security["sasl_mechanism"] = broker.sasl.mechanism
        security["sasl_plain_username"] = broker.sasl.username
        security["sasl_plain_password"] = secret_from_env(
            "broker.sasl.password_env", broker.sasl.password_env, environ
        )
    c = broker.consumer
    group = {
        "session_timeout_ms": _ms(c.session_timeout_s),
        "heartbeat_interval_ms": _ms(c.heartbeat_interval_s),
        "rebalance_timeout_ms": _ms(c.rebalance_timeout_s or c.session_timeout_s),
    }
    if c.request_timeout_s is not None:
        group["request_timeout_ms"] = _ms(c.request_timeout_s)
    return KafkaClients(security, group)


def ssl_context(tls: TlsConfig, environ: Mapping[str, str] | None = None) -> ssl.SSLContext:
    """A client TLS context: the CA file (or the system's CAs), the client certificate if
    given, hostname checking as configured."""
    try:
        context = ssl.create_default_context(
            cafile=str(tls.ca_file) if tls.ca_file is not None else None
        )
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            _("{field}: cannot use {files}: {problem}").format(
                field="broker.tls.ca_file", files=tls.ca_file, problem=exc
            )
        ) from None
    context.check_hostname = tls.check_hostname
    if tls.cert_file is not None:
        password = None
        if tls.key_password_env is not None:
            password = secret_from_env("broker.tls.key_password_env", tls.key_password_env, environ)
        try:
            context.load_cert_chain(
                str(tls.cert_file),
                str(tls.key_file) if tls.key_file is not None else None,
                password,
            )
        except (OSError, ssl.SSLError) as exc:
            files = f"{tls.cert_file}" + (f", {tls.key_file}" if tls.key_file else "")
            raise ConfigError(
                _("{field}: cannot use {files}: {problem}").format(
                    field="broker.tls.cert_file", files=files, problem=exc
                )
            ) from None
    return context


def _ms(seconds: float) -> int:
    return round(seconds * 1000)
