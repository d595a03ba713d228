"""The configuration of where the sealed ledger lives (`ledger.segments_url`, and how to reach
an S3-compatible store: `ledger.object_store`), and the object store it names.

Credentials never sit in the file: by default the AWS SDK's own chain is used (the
`AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` / `AWS_SESSION_TOKEN` variables, a profile or an
instance role); `access_key_id_env` / `secret_access_key_env` / `session_token_env` name other
variables to read them from instead."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import Field

from tally.config_fields import EnvName, Strict, secret_from_env

if TYPE_CHECKING:  # imported where used: loading a config must not load pyarrow and DuckDB
    from ledger.store.objects import ObjectStore, S3Settings
    from ledger.store.replica import Publisher

SEGMENTS_URL_PATTERN = r"^(s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[^\s]*)?|file:///[^\s]*)$"


class ObjectStoreConfig(Strict):
    """How to reach the store `ledger.segments_url` names (S3 only)."""

    endpoint_url: str | None = Field(None, pattern=r"^https?://[^\s/]+(/[^\s]*)?$")
    region: str = "us-east-1"
    access_key_id_env: EnvName | None = None
    secret_access_key_env: EnvName | None = None
    session_token_env: EnvName | None = None
    timeout_s: float = Field(10.0, gt=0, le=300)
    # superseded segments stay this long after a manifest stops naming them (readers of the
    # previous manifest can still fetch them)
    grace_s: float = Field(3600.0, ge=0)

    def s3_settings(self) -> S3Settings:
        from ledger.store.objects import S3Settings

        def secret(name: str, variable: str | None) -> str | None:
            return (
                None
                if variable is None
                else secret_from_env(f"ledger.object_store.{name}", variable)
            )

        return S3Settings(
            endpoint_url=self.endpoint_url,
            region=self.region,
            access_key_id=secret("access_key_id_env", self.access_key_id_env),
            secret_access_key=secret("secret_access_key_env", self.secret_access_key_env),
            session_token=secret("session_token_env", self.session_token_env),
            timeout_s=self.timeout_s,
        )


def segments_store(url: str | None, config: ObjectStoreConfig) -> ObjectStore | None:
    """The object store `url` names (None: the sealed ledger stays in the data directory)."""
    from ledger.store.objects import open_object_store

    if url is None:
        return None
    return open_object_store(url, config.s3_settings() if url.startswith("s3://") else None)


def publisher(data_dir: Path, url: str | None, config: ObjectStoreConfig) -> Publisher | None:
    """The writer's publisher to the configured store (None: none configured)."""
    from ledger.store.replica import Publisher

    store = segments_store(url, config)
    return None if store is None else Publisher(data_dir, store, grace_s=config.grace_s)


def reader_dir(data_dir: Path, url: str | None, config: ObjectStoreConfig) -> Path:
    """The directory a reader reads the sealed ledger from: `data_dir` itself, or, with a
    store configured, the read cache under it (`<data_dir>/replica`), brought up to date."""
    from ledger.store.replica import REPLICA_DIR, pull

    store = segments_store(url, config)
    if store is None:
        return data_dir
    return pull(store, data_dir / REPLICA_DIR)


def segments_env(url: str | None, config: ObjectStoreConfig) -> dict[str, str]:
    """The store as a child process (the dashboard) reads it from its environment
    (`ledger.store.replica.store_from_env`): the URL, endpoint and region, and the credentials
    the `*_env` keys name as the AWS SDK's own variables. No store: nothing."""
    if url is None:
        return {}
    env = {"TALLY_SEGMENTS_URL": url, "TALLY_SEGMENTS_REGION": config.region}
    if config.endpoint_url:
        env["TALLY_SEGMENTS_ENDPOINT_URL"] = config.endpoint_url
    if url.startswith("s3://"):
        s3 = config.s3_settings()
        for name, value in (
            ("AWS_ACCESS_KEY_ID", s3.access_key_id),
            ("AWS_SECRET_ACCESS_KEY", s3.secret_access_key),
            ("AWS_SESSION_TOKEN", s3.session_token),
        ):
            if value:
                env[name] = value
    return env
