"""The object-store port: where the sealed ledger (segments, the raw-event archive, their
manifests and the side files) is kept when `ledger.segments_url` names one, and its two
adapters: a local directory (`file://…`, and the in-process fake of the contract suite) and
S3-compatible object storage (`s3://bucket/prefix`, through pyarrow's built-in S3 client, so
no DuckDB extension has to be downloaded) — and `PrefixedStore`, the port over a key prefix of
another store (one shard of a sharded ledger: `shards/<name>/`).

The port is small on purpose: whole objects, addressed by a `/`-separated key under the
store's root. `put` is atomic from a reader's view (an S3 PUT is; the local adapter writes a
temporary file and renames it), so a reader sees the old object or the new one, never part of
one. Every failure to reach or use the store is an `OSError` (a missing object:
`FileNotFoundError`), so callers retry one kind of error.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

import pyarrow.fs as pafs

from ledger.errors import StoreError
from ledger.store.segments import atomic_write_bytes


class WriteConflict(StoreError):
    """A conditional put (`ObjectStore.put_if`) found the object not as the writer last saw
    it: another writer replaced it, created it, or removed it."""

    def __init__(self, where: str) -> None:
        super().__init__(f"{where}: changed by another writer since this one last read it")
        self.where = where


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """One stored object: its key under the store's root, its size in bytes, and when it was
    last written (UTC seconds)."""

    key: str
    size: int
    mtime_s: float


class ObjectStore(Protocol):
    """Whole objects under one root, by key (`segments/manifest.json`)."""

    def get(self, key: str) -> bytes:
        """The object's bytes; `FileNotFoundError` when there is none."""
        ...

    def put(self, key: str, data: bytes) -> None:
        """Store `data` under `key`, replacing any object there, atomically."""
        ...

    def delete(self, key: str) -> None:
        """Remove the object (none there: nothing happens)."""
        ...

    def get_tagged(self, key: str) -> tuple[bytes, str]:
        """The object's bytes and its tag (what `put_if` compares); `FileNotFoundError` when
        there is none."""
        ...

    def put_if(self, key: str, data: bytes, tag: str | None) -> str:
        """Store `data` under `key` only if the object there still has `tag` (None: only if
        there is no object), atomically, and return the new object's tag; `WriteConflict`
        otherwise."""
        ...

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        """The objects whose keys start with `prefix`, by key."""
        ...

    def folders(self, folder: str = "") -> Sequence[str]:
        """The names of the folders directly under `folder` (`shards` → each shard's name), by
        name: one listing of that level (on S3, with a delimiter), not of the objects below."""
        ...

    def describe(self) -> str:
        """Where the store is, for messages (a URL, never a credential)."""
        ...


def _check_key(key: str) -> str:
    parts = key.split("/")
    if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"invalid object key {key!r}")
    return key


def _folder_of(prefix: str) -> str:
    """The folder a key prefix lies in (`shards/a/head` → `shards/a`; `segments/` →
    `segments`): every key starting with the prefix is under it."""
    folder = prefix.rpartition("/")[0]
    return folder if folder and all(p not in ("", ".", "..") for p in folder.split("/")) else ""


def _holds_objects(folder: Path) -> bool:
    """Whether an object lies anywhere under `folder` (as on S3, where a folder is only the
    prefix of its objects: one whose objects were all deleted is gone); stops at the first."""
    return any(p.is_file() and not p.name.startswith(".") for p in folder.rglob("*"))


class LocalObjectStore:
    """Objects as files under a directory (`file:///path`)."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)

    def get(self, key: str) -> bytes:
        return (self.root / _check_key(key)).read_bytes()

    def put(self, key: str, data: bytes) -> None:
        atomic_write_bytes(self.root / _check_key(key), data)

    def delete(self, key: str) -> None:
        (self.root / _check_key(key)).unlink(missing_ok=True)

    def get_tagged(self, key: str) -> tuple[bytes, str]:
        data = self.get(key)
        return data, hashlib.sha256(data).hexdigest()

    def put_if(self, key: str, data: bytes, tag: str | None) -> str:
        path = self.root / _check_key(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        # `.name.lock`: skipped by `list`, like a write in progress
        with (path.parent / f".{path.name}.lock").open("a") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)  # released when the file closes
            try:
                current: str | None = hashlib.sha256(path.read_bytes()).hexdigest()
            except FileNotFoundError:
                current = None
            if current != tag:
                raise WriteConflict(f"{self.describe()}/{key}")
            atomic_write_bytes(path, data)
        return hashlib.sha256(data).hexdigest()

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        top = self.root / _folder_of(prefix)  # walk only the folder the prefix lies in
        if not top.is_dir():
            return []
        found = []
        for path in top.rglob("*"):
            key = path.relative_to(self.root).as_posix()
            if path.name.startswith(".") or not key.startswith(prefix) or not path.is_file():
                continue  # `.name.tmp-<pid>`: a write in progress
            st = path.stat()
            found.append(ObjectInfo(key, st.st_size, st.st_mtime))
        return sorted(found, key=lambda o: o.key)

    def folders(self, folder: str = "") -> Sequence[str]:
        top = self.root / _check_key(folder.strip("/")) if folder.strip("/") else self.root
        if not top.is_dir():
            return []
        return sorted(
            p.name
            for p in top.iterdir()
            if p.is_dir() and not p.name.startswith(".") and _holds_objects(p)
        )

    def describe(self) -> str:
        return self.root.resolve().as_uri()


@dataclass(frozen=True, slots=True)
class S3Settings:
    """How to reach an S3-compatible store. Empty credentials: the AWS SDK's own chain (the
    `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` / `AWS_SESSION_TOKEN` variables, a profile,
    an instance role). `endpoint_url`: an S3-compatible server (`http://minio:9000`); None:
    AWS itself."""

    endpoint_url: str | None = None
    region: str = "us-east-1"
    access_key_id: str | None = None
    secret_access_key: str | None = None
    session_token: str | None = None
    timeout_s: float = 10.0


class S3ObjectStore:
    """Objects in an S3 bucket under a key prefix (`s3://bucket/prefix`)."""

    def __init__(self, bucket: str, prefix: str, settings: S3Settings) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        options: dict[str, object] = {
            "region": settings.region,
            "connect_timeout": settings.timeout_s,
            "request_timeout": settings.timeout_s,
            "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=2),
            # a small object is one PUT when the stream closes, not a three-request multipart
            # upload (a large one is still a multipart upload, visible only once completed)
            "allow_delayed_open": True,
        }
        if settings.access_key_id:
            options["access_key"] = settings.access_key_id
            options["secret_key"] = settings.secret_access_key or ""
            if settings.session_token:
                options["session_token"] = settings.session_token
        if settings.endpoint_url:
            endpoint = urlsplit(settings.endpoint_url)
            options["endpoint_override"] = endpoint.netloc or endpoint.path
            options["scheme"] = endpoint.scheme or "https"
        self._fs = pafs.S3FileSystem(**options)
        self._settings = settings
        self._client: Any = None  # boto3's, for the conditional requests only; made when used

    def _path(self, key: str) -> str:
        base = f"{self.bucket}/{self.prefix}" if self.prefix else self.bucket
        return f"{base}/{_check_key(key)}"

    def get(self, key: str) -> bytes:
        with self._fs.open_input_stream(self._path(key)) as stream:
            return bytes(stream.read())

    def put(self, key: str, data: bytes) -> None:
        with self._fs.open_output_stream(self._path(key)) as stream:
            stream.write(data)

    def delete(self, key: str) -> None:
        # boto3, not pyarrow: pyarrow's delete leaves a marker of the emptied folder behind
        with contextlib.suppress(FileNotFoundError), self._s3_errors(key, conflict=False):
            self._boto().delete_object(Bucket=self.bucket, Key=self._object_key(key))

    def get_tagged(self, key: str) -> tuple[bytes, str]:
        with self._s3_errors(key, conflict=False):
            answer = self._boto().get_object(Bucket=self.bucket, Key=self._object_key(key))
            return bytes(answer["Body"].read()), str(answer["ETag"])

    def put_if(self, key: str, data: bytes, tag: str | None) -> str:
        condition = {"IfNoneMatch": "*"} if tag is None else {"IfMatch": tag}
        with self._s3_errors(key, conflict=True):
            answer = self._boto().put_object(
                Bucket=self.bucket, Key=self._object_key(key), Body=data, **condition
            )
            return str(answer["ETag"])

    def _object_key(self, key: str) -> str:
        return f"{self.prefix}/{_check_key(key)}" if self.prefix else _check_key(key)

    def _boto(self) -> Any:
        if self._client is None:
            import boto3
            from botocore.config import Config

            s = self._settings
            self._client = boto3.client(
                "s3",
                endpoint_url=s.endpoint_url,
                region_name=s.region,
                aws_access_key_id=s.access_key_id or None,
                aws_secret_access_key=s.secret_access_key or None,
                aws_session_token=s.session_token or None,
                config=Config(
                    connect_timeout=s.timeout_s,
                    read_timeout=s.timeout_s,
                    retries={"max_attempts": 2, "mode": "standard"},
                ),
            )
        return self._client

    @contextlib.contextmanager
    def _s3_errors(self, key: str, *, conflict: bool) -> Iterator[None]:
        """boto3's errors as this port's: a failed condition (412, or 409 when two conditional
        writes race; on a put, an object gone too) is a `WriteConflict`, a missing object a
        `FileNotFoundError`, anything else an `OSError` naming the key."""
        from botocore.exceptions import BotoCoreError, ClientError

        where = f"{self.describe()}/{key}"
        try:
            yield
        except ClientError as exc:
            error = exc.response.get("Error", {})
            code = str(error.get("Code", ""))
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            missing = code in ("NoSuchKey", "404") or status == 404
            if code in ("PreconditionFailed", "ConditionalRequestConflict") or (
                conflict and (status in (409, 412) or missing)
            ):
                raise WriteConflict(where) from exc
            if missing:
                raise FileNotFoundError(errno.ENOENT, "no such object", key) from exc
            raise OSError(errno.EIO, f"{code}: {error.get('Message', exc)}", key) from exc
        except BotoCoreError as exc:
            raise OSError(errno.EIO, str(exc), key) from exc

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        base = f"{self.bucket}/{self.prefix}" if self.prefix else self.bucket
        folder = _folder_of(prefix)  # list only under the folder the prefix lies in
        top = f"{base}/{folder}" if folder else base
        selector = pafs.FileSelector(top, recursive=True, allow_not_found=True)
        found = []
        for info in self._fs.get_file_info(selector):
            if info.type != pafs.FileType.File:
                continue  # a "directory" marker
            key = info.path[len(base) + 1 :]
            if key.startswith(prefix):
                mtime = info.mtime.timestamp() if info.mtime is not None else 0.0
                found.append(ObjectInfo(key, int(info.size or 0), mtime))
        return sorted(found, key=lambda o: o.key)

    def folders(self, folder: str = "") -> Sequence[str]:
        base = f"{self.bucket}/{self.prefix}" if self.prefix else self.bucket
        name = folder.strip("/")
        top = f"{base}/{_check_key(name)}" if name else base
        # not recursive: one ListObjectsV2 with the delimiter "/", its common prefixes
        selector = pafs.FileSelector(top, recursive=False, allow_not_found=True)
        return sorted(
            info.base_name
            for info in self._fs.get_file_info(selector)
            if info.type == pafs.FileType.Directory
        )

    def describe(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}".rstrip("/")


class PrefixedStore:
    """The objects of `inner` under the key prefix `prefix/`, as a store of their own: every
    operation's key is relative to the prefix (`list` returns keys relative to it too), so a
    writer or reader of one ledger works unchanged on a part of a larger store (a shard under
    `shards/<name>/`). Errors name the full key (`describe` includes the prefix)."""

    def __init__(self, inner: ObjectStore, prefix: str) -> None:
        self.inner = inner
        self.prefix = _check_key(prefix.strip("/"))

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{_check_key(key)}"

    def get(self, key: str) -> bytes:
        return self.inner.get(self._key(key))

    def put(self, key: str, data: bytes) -> None:
        self.inner.put(self._key(key), data)

    def delete(self, key: str) -> None:
        self.inner.delete(self._key(key))

    def get_tagged(self, key: str) -> tuple[bytes, str]:
        return self.inner.get_tagged(self._key(key))

    def put_if(self, key: str, data: bytes, tag: str | None) -> str:
        return self.inner.put_if(self._key(key), data, tag)

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        cut = len(self.prefix) + 1
        return [
            ObjectInfo(o.key[cut:], o.size, o.mtime_s)
            for o in self.inner.list(f"{self.prefix}/{prefix}")
        ]

    def folders(self, folder: str = "") -> Sequence[str]:
        name = folder.strip("/")
        return self.inner.folders(self._key(name) if name else self.prefix)

    def describe(self) -> str:
        return f"{self.inner.describe()}/{self.prefix}"


def open_object_store(url: str, settings: S3Settings | None = None) -> ObjectStore:
    """The store a `segments_url` names: `s3://bucket[/prefix]` or `file:///path`."""
    parts = urlsplit(url)
    if parts.scheme == "s3" and parts.netloc:
        return S3ObjectStore(parts.netloc, parts.path, settings or S3Settings())
    if parts.scheme == "file" and parts.path and not parts.netloc:
        return LocalObjectStore(os.path.abspath(parts.path))
    raise ValueError(f"{url!r}: expected s3://bucket[/prefix] or file:///path")
