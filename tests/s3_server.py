"""A real S3 API server on loopback for the tests: moto's standalone server
(`ThreadedMotoServer`), started once per session on a free port, and a fresh bucket per test.
The object-store adapters reach it over HTTP as they would reach AWS or MinIO."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from ledger.store.objects import S3ObjectStore, S3Settings
from tally.metrics import free_port

ACCESS_KEY, SECRET_KEY, REGION = "tally-test", "tally-test-secret", "us-east-1"
_buckets = itertools.count()


@dataclass(frozen=True, slots=True)
class S3Server:
    endpoint_url: str

    def settings(self) -> S3Settings:
        return S3Settings(self.endpoint_url, REGION, ACCESS_KEY, SECRET_KEY, timeout_s=5.0)

    def create_bucket(self, name: str) -> None:
        import boto3  # imported when used: every test session loads this module

        client = boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=REGION,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
        )
        client.create_bucket(Bucket=name)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
    port = free_port("127.0.0.1")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield S3Server(f"http://127.0.0.1:{port}")
    finally:
        server.stop()


@pytest.fixture
def s3_bucket(s3_server: S3Server) -> str:
    """A fresh, empty bucket on the session's server (its name)."""
    name = f"tally-{next(_buckets)}"
    s3_server.create_bucket(name)
    return name


@pytest.fixture
def s3_store(s3_server: S3Server, s3_bucket: str) -> S3ObjectStore:
    """The store of a fresh bucket, under a key prefix (as `s3://bucket/prefix`)."""
    return S3ObjectStore(s3_bucket, "ledger/prod", s3_server.settings())
