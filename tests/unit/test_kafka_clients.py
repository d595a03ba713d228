"""The `broker:` section → Kafka client settings (`tally.kafka_clients`): security keywords for
every aiokafka client, the same as Faust credentials, group timeouts; invalid combinations
and unusable secrets are configuration errors naming the field (exit 2)."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tally.cli import cli
from tally.components import worker_settings
from tally.config import ConfigError, parse_config
from tally.kafka_clients import kafka_clients
from tests.builders import a_config_dict
from tests.conftest import write_config

TLS = Path(__file__).resolve().parent.parent / "fixtures" / "kafka_tls"
ENV = {"KAFKA_PASSWORD": "pa55", "KEY_PASSWORD": "s3cret"}


def _broker(**broker: Any) -> dict[str, Any]:
    return a_config_dict(
        broker={"mode": "external", "bootstrap_servers": ["kafka-1:9093"], **broker}
    )


def _clients(data: dict[str, Any], environ: dict[str, str] | None = None) -> Any:
    return kafka_clients(parse_config(data).broker, ENV if environ is None else environ)


SASL = {"username": "tally", "password_env": "KAFKA_PASSWORD"}


@pytest.mark.parametrize(
    ("broker", "expected", "tls"),
    [
        pytest.param({}, {"security_protocol": "PLAINTEXT"}, False, id="plaintext"),
        pytest.param(
            {"security_protocol": "SASL_PLAINTEXT", "sasl": {**SASL, "mechanism": "PLAIN"}},
            {
                "security_protocol": "SASL_PLAINTEXT",
                "sasl_mechanism": "PLAIN",
                "sasl_plain_username": "tally",
                "sasl_plain_password": "pa55",
            },
            False,
            id="sasl-plaintext-plain",
        ),
        pytest.param(
            {"security_protocol": "SASL_PLAINTEXT", "sasl": {**SASL, "mechanism": "SCRAM-SHA-256"}},
            {
                "security_protocol": "SASL_PLAINTEXT",
                "sasl_mechanism": "SCRAM-SHA-256",
                "sasl_plain_username": "tally",
                "sasl_plain_password": "pa55",
            },
            False,
            id="sasl-plaintext-scram-256",
        ),
        pytest.param(
            {
                "security_protocol": "SASL_SSL",
                "sasl": SASL,  # mechanism defaults to SCRAM-SHA-512
                "tls": {"ca_file": str(TLS / "ca.pem")},
            },
            {
                "security_protocol": "SASL_SSL",
                "sasl_mechanism": "SCRAM-SHA-512",
                "sasl_plain_username": "tally",
                "sasl_plain_password": "pa55",
            },
            True,
            id="sasl-ssl-scram-512",
        ),
        pytest.param(
            {"security_protocol": "SSL"},  # no tls: section: the system's CAs
            {"security_protocol": "SSL"},
            True,
            id="ssl-system-cas",
        ),
        pytest.param(
            {
                "security_protocol": "SSL",
                "tls": {
                    "ca_file": str(TLS / "ca.pem"),
                    "cert_file": str(TLS / "client.pem"),
                    "key_file": str(TLS / "client-encrypted.key"),
                    "key_password_env": "KEY_PASSWORD",
                },
            },
            {"security_protocol": "SSL"},
            True,
            id="mutual-tls-encrypted-key",
        ),
    ],
)
def test_the_broker_section_maps_to_every_clients_security_keywords(
    broker: dict[str, Any], expected: dict[str, str], tls: bool
):
    security = dict(_clients(_broker(**broker)).security)
    context = security.pop("ssl_context", None)
    assert security == expected
    assert (context is not None) == tls
    if context is not None:
        assert isinstance(context, ssl.SSLContext)
        assert context.verify_mode == ssl.CERT_REQUIRED
        assert context.check_hostname


@pytest.mark.parametrize(
    "broker",
    [
        pytest.param({}, id="plaintext"),
        pytest.param({"security_protocol": "SASL_PLAINTEXT", "sasl": SASL}, id="sasl-plaintext"),
        pytest.param(
            {"security_protocol": "SASL_SSL", "sasl": SASL, "tls": {"check_hostname": False}},
            id="sasl-ssl",
        ),
        pytest.param({"security_protocol": "SSL"}, id="ssl"),
    ],
)
def test_faust_gets_the_same_security_as_the_aiokafka_clients(broker: dict[str, Any]):
    from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

    clients = _clients(_broker(**broker))
    faust_auth = credentials_to_aiokafka_auth(clients.faust_credentials())
    given = {key: value for key, value in faust_auth.items() if value is not None}
    assert given == dict(clients.security)


def test_a_tls_context_checks_hostnames_unless_told_not_to():
    clients = _clients(_broker(security_protocol="SSL", tls={"check_hostname": False}))
    assert clients.security["ssl_context"].check_hostname is False


@pytest.mark.parametrize(
    ("broker", "message"),
    [
        pytest.param(
            {"security_protocol": "SASL_SSL"},
            "broker: sasl: security_protocol SASL_SSL needs a sasl: section",
            id="sasl-protocol-without-credentials",
        ),
        pytest.param(
            {"sasl": SASL},
            "broker: sasl: given, but security_protocol is PLAINTEXT",
            id="credentials-without-sasl-protocol",
        ),
        pytest.param(
            {"security_protocol": "SASL_PLAINTEXT", "sasl": SASL, "tls": {}},
            "broker: tls: given, but security_protocol is SASL_PLAINTEXT",
            id="tls-without-ssl-protocol",
        ),
        pytest.param(
            {"mode": "embedded", "bootstrap_servers": [], "security_protocol": "SSL"},
            "broker: security_protocol: the embedded broker speaks PLAINTEXT only",
            id="embedded-with-ssl",
        ),
        pytest.param(
            {"security_protocol": "SSL", "tls": {"key_file": "client.key"}},
            "broker.tls: key_file needs cert_file",
            id="key-without-certificate",
        ),
        pytest.param(
            {"security_protocol": "SASL_SSL", "sasl": {**SASL, "mechanism": "GSSAPI"}},
            "broker.sasl.mechanism: Input should be 'PLAIN', 'SCRAM-SHA-256' or 'SCRAM-SHA-512'",
            id="unsupported-mechanism",
        ),
        pytest.param(
            {"security_protocol": "SASL_SSL", "sasl": {"username": "tally", "password": "x"}},
            "broker.sasl.password: Extra inputs are not permitted",
            id="password-in-the-file",
        ),
        pytest.param(
            {"consumer": {"session_timeout_s": 10, "heartbeat_interval_s": 10}},
            "broker.consumer: heartbeat_interval_s (10.0) must be below session_timeout_s",
            id="heartbeat-not-below-session",
        ),
    ],
)
def test_invalid_broker_settings_are_config_errors_naming_the_field(
    broker: dict[str, Any], message: str
):
    with pytest.raises(ConfigError) as err:
        parse_config(_broker(**broker), "tally.yaml")
    assert f"tally.yaml: {message}" in str(err.value)


@pytest.mark.parametrize(
    ("broker", "environ", "message"),
    [
        pytest.param(
            {"security_protocol": "SASL_PLAINTEXT", "sasl": SASL},
            {},
            "broker.sasl.password_env: environment variable KAFKA_PASSWORD is not set",
            id="password-variable-unset",
        ),
        pytest.param(
            {"security_protocol": "SSL", "tls": {"ca_file": "/nonexistent/ca.pem"}},
            ENV,
            "broker.tls.ca_file: cannot use /nonexistent/ca.pem",
            id="ca-file-missing",
        ),
        pytest.param(
            {
                "security_protocol": "SSL",
                "tls": {
                    "cert_file": str(TLS / "client.pem"),
                    "key_file": str(TLS / "client-encrypted.key"),
                    "key_password_env": "KEY_PASSWORD",
                },
            },
            {"KEY_PASSWORD": "wrong"},
            "broker.tls.cert_file: cannot use",
            id="wrong-key-password",
        ),
        pytest.param(
            {
                "security_protocol": "SSL",
                "tls": {"cert_file": str(TLS / "ca.pem"), "key_file": str(TLS / "client.key")},
            },
            ENV,
            "broker.tls.cert_file: cannot use",
            id="key-not-of-the-certificate",
        ),
    ],
)
def test_secrets_and_tls_files_that_cannot_be_used_name_the_field(
    broker: dict[str, Any], environ: dict[str, str], message: str
):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        _clients(_broker(**broker), environ)


def test_tls_files_are_relative_to_the_config_file(tmp_path: Path):
    (tmp_path / "certs").mkdir()
    (tmp_path / "certs" / "ca.pem").write_bytes((TLS / "ca.pem").read_bytes())
    path = write_config(
        tmp_path / "tally.yaml",
        _broker(security_protocol="SSL", tls={"ca_file": "certs/ca.pem"}),
    )
    from tally.config import load_config

    tls = load_config(path).broker.tls
    assert tls is not None and tls.ca_file == tmp_path / "certs" / "ca.pem"


def test_a_command_without_its_kafka_password_exits_2_naming_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.delenv("KAFKA_PASSWORD", raising=False)
    data = _broker(security_protocol="SASL_SSL", sasl=SASL)
    data["ledger"] = {"data_dir": str(tmp_path / "data")}
    path = write_config(tmp_path / "tally.yaml", data)
    result = CliRunner().invoke(cli, ["worker", "--config", str(path)])
    assert result.exit_code == 2, result.output
    assert "broker.sasl.password_env: environment variable KAFKA_PASSWORD is not set" in (
        result.output
    )


def test_group_timeouts_reach_the_worker_faust_app_and_its_samples_consumer(tmp_path: Path):
    import asyncio

    from streams.worker import LedgerWorker

    consumer = {
        "session_timeout_s": 30,
        "heartbeat_interval_s": 3,
        "rebalance_timeout_s": 60,
        "request_timeout_s": 45,
    }
    data = _broker(consumer=consumer)
    data["ledger"] = {"data_dir": str(tmp_path / "data")}
    config = parse_config(data)
    clients = kafka_clients(config.broker, {})
    assert dict(clients.group) == {
        "session_timeout_ms": 30_000,
        "heartbeat_interval_ms": 3_000,
        "rebalance_timeout_ms": 60_000,
        "request_timeout_ms": 45_000,
    }
    worker = LedgerWorker(worker_settings(config, ("kafka-1:9093",), clients))
    try:
        conf = worker.app.conf
        assert (conf.broker_session_timeout, conf.broker_heartbeat_interval) == (30.0, 3.0)
        assert (conf.broker_rebalance_timeout, conf.broker_request_timeout) == (60.0, 45.0)

        async def samples_consumer_timeouts() -> tuple[int, int, int, int]:
            c = worker._samples._new_consumer()
            try:
                return (
                    c._session_timeout_ms,
                    c._heartbeat_interval_ms,
                    c._rebalance_timeout_ms,
                    c._request_timeout_ms,
                )
            finally:
                await c.stop()

        assert asyncio.run(samples_consumer_timeouts()) == (30_000, 3_000, 60_000, 45_000)
    finally:
        worker.store.close()


def test_the_default_group_timeouts_are_the_embedded_brokers():
    clients = _clients(a_config_dict())
    assert dict(clients.group) == {
        "session_timeout_ms": 6000,
        "heartbeat_interval_ms": 1000,
        "rebalance_timeout_ms": 6000,
    }
    assert dict(clients.security) == {"security_protocol": "PLAINTEXT"}
