"""`ledger.segments_url` and `ledger.object_store` in the configuration, and how each process
finds the store: the `tally ledger seal` command publishes to it, and the dashboard, handed
the store and its credentials in its environment by the stack, reads through its cache."""

from __future__ import annotations

import asyncio
import logging
import uuid

import pytest
from click.testing import CliRunner

from ledger.read.queries import LedgerQueries
from ledger.store.hot import DuckDBStore
from ledger.store.objects import LocalObjectStore, S3ObjectStore
from ledger.store.published import PublishedStore
from ledger.store.replica import REPLICA_DIR, Publisher, pull, read_published
from streams.worker import LedgerWorker
from tally.cli import cli
from tally.components import worker_settings
from tally.config import ConfigError, load_config, parse_config
from tally.kafka_clients import kafka_clients
from tally.metrics import TallyMetrics
from tally.stack import ledger_env
from tests.builders import a_config_dict
from tests.conftest import write_config
from tests.s3_server import ACCESS_KEY, SECRET_KEY
from tests.unit.test_store import ingest, message


def totals(data_dir):
    q = LedgerQueries(data_dir)
    try:
        return q.transaction_count(), q.totals_by_unit()
    finally:
        q.close()


@pytest.mark.parametrize(
    "url",
    ["s3://tally-ledger", "s3://tally-ledger/prod/eu", "s3://a.b-c/x", "file:///srv/tally"],
    ids=["bucket", "bucket-prefix", "dotted-bucket", "file"],
)
def test_a_segments_url_is_accepted(url):
    config = parse_config(a_config_dict(ledger={"segments_url": url}), "test")
    assert config.ledger.segments_url == url


@pytest.mark.parametrize(
    "url",
    ["tally-ledger/prod", "s3://", "s3://UPPER/x", "http://minio:9000/b", "file://host/x"],
    ids=["no-scheme", "no-bucket", "upper-case-bucket", "http", "file-with-host"],
)
def test_a_segments_url_of_another_kind_is_refused(url):
    with pytest.raises(ConfigError, match="segments_url"):
        parse_config(a_config_dict(ledger={"segments_url": url}), "test")


def test_the_seal_command_publishes_to_the_configured_store(tmp_path):
    live = tmp_path / "writer"
    with DuckDBStore(live) as writer:
        ingest(writer, message(0, 1, 2), message(1, 3))
        assert writer.hot_rows() > 0
    store = tmp_path / "store"
    config = write_config(
        tmp_path / "tally.yaml",
        a_config_dict(ledger={"data_dir": str(live), "segments_url": store.as_uri()}),
    )
    result = CliRunner().invoke(cli, ["ledger", "seal", "-c", str(config)])
    assert result.exit_code == 0, result.output
    objects = LocalObjectStore(store)
    for name in ("segments/manifest.json", "archive/manifest.json"):
        assert read_published(objects, name) == (live / name).read_bytes()
    assert totals(pull(objects, tmp_path / "reader")) == totals(live) and totals(live)[0] == 3


def test_the_dashboard_reads_the_store_the_stack_hands_it(
    tmp_path, monkeypatch, s3_server, s3_bucket
):
    remote = S3ObjectStore(s3_bucket, "ledger", s3_server.settings())
    live = tmp_path / "writer"
    with PublishedStore(live, Publisher(live, remote)) as writer:
        ingest(writer, message(0, 1, 2), message(1, 3))
        writer.seal()
    monkeypatch.setenv("TEST_S3_KEY", ACCESS_KEY)
    monkeypatch.setenv("TEST_S3_SECRET", SECRET_KEY)
    path = write_config(
        tmp_path / "tally.yaml",
        a_config_dict(
            ledger={
                "data_dir": str(tmp_path / "dashboard"),
                "segments_url": f"s3://{s3_bucket}/ledger",
                "object_store": {
                    "endpoint_url": s3_server.endpoint_url,
                    "access_key_id_env": "TEST_S3_KEY",
                    "secret_access_key_env": "TEST_S3_SECRET",
                },
            }
        ),
    )
    env = ledger_env(load_config(path), path)
    # the credentials reach the dashboard as the AWS SDK's own variables, nothing else
    assert (env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]) == (ACCESS_KEY, SECRET_KEY)
    assert "AWS_SESSION_TOKEN" not in env
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    from dashboard import common

    read = common.data_dir()
    assert read == tmp_path / "dashboard" / REPLICA_DIR
    assert totals(read) == totals(live)


def test_a_worker_with_a_store_seals_to_it_and_waits_while_the_store_refuses(
    tmp_path, monkeypatch, caplog, s3_server
):
    """The worker built from the configuration publishes its seals; a store that refuses (its
    bucket does not exist yet) blocks sealing like a full disk — one error, rows kept hot —
    and the first seal after the bucket appears publishes everything."""
    bucket = f"tally-late-{uuid.uuid4().hex[:12]}"  # created only later, by the test
    monkeypatch.setenv("TEST_S3_KEY", ACCESS_KEY)
    monkeypatch.setenv("TEST_S3_SECRET", SECRET_KEY)
    data = a_config_dict(
        ledger={
            "data_dir": str(tmp_path / "worker"),
            "segments_url": f"s3://{bucket}/ledger",
            "object_store": {
                "endpoint_url": s3_server.endpoint_url,
                "access_key_id_env": "TEST_S3_KEY",
                "secret_access_key_env": "TEST_S3_SECRET",
            },
        }
    )
    config = parse_config(data, "test")
    settings = worker_settings(config, ("127.0.0.1:1",), kafka_clients(config.broker, {}))
    metrics = TallyMetrics(sections=("worker",))
    w = LedgerWorker(settings, metrics)
    try:
        assert isinstance(w.store, PublishedStore)
        w.store.publisher.backoff_s = 0.0
        ingest(w.store, message(0, 1, 2), message(1, 3))
        waiting = w.store.hot_rows()
        caplog.set_level(logging.INFO, logger="tally.worker")
        asyncio.run(w.seal())
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 1 and errors[0].startswith(f"sealing stopped: s3://{bucket}/ledger")
        assert metrics.registry.get_sample_value("tally_worker_sealing_blocked") == 1
        assert w.store.hot_rows() == waiting

        s3_server.create_bucket(bucket)
        asyncio.run(w.seal())
        assert metrics.registry.get_sample_value("tally_worker_sealing_blocked") == 0
        assert w.store.hot_rows() == 0
        store = S3ObjectStore(bucket, "ledger", s3_server.settings())
        assert totals(pull(store, tmp_path / "reader")) == totals(settings.data_dir)
        assert totals(settings.data_dir)[0] == 3
    finally:
        w.store.close()
