"""The head of a published ledger: the one mutable object of a sealed ledger on an object store
(`head.json`), and the writer fencing it carries.

Everything else a writer publishes is immutable once stored and named by its content: a segment
file (or rollup) under its path in the manifest with the start of its sha256 before the suffix
(`segment_key`), and every file that changes from seal to seal (the two manifests, the side
files, the ledger's identity) as a *version* stored under its content's sha256
(`versions/<file>/<sha256>`). So two writers never store different bytes under one key: a
fenced writer that seals a source range again — with other content than its successor's — puts
an object of its own beside the successor's, never over it. The head names the version of each
such file that makes up the ledger, so one PUT of the head publishes a whole seal at once, and a
reader that reads the head first reads one consistent ledger.

The head also says which writer holds the ledger: an epoch and an owner. A writer *claims* the
ledger when it starts publishing (epoch + 1, a conditional put on the head it read) and every
later head it writes is a conditional put on the tag of its own last one
(`ObjectStore.put_if`). A writer that lost its turn — another one claimed the ledger while it
was paused or cut off — fails that put: `WriterFenced`. Files it stored before the failing put
are named by no head, so no reader ever reads them; they are deleted as strays after the grace
period. A head that carries this writer's own epoch and owner was written by this writer (a PUT
that landed though its answer was lost), not by another: the writer adopts its tag.
"""

from __future__ import annotations

import json
import os
import socket
import uuid
from dataclasses import dataclass

from ledger.errors import SegmentError, StoreError

HEAD_KEY = "head.json"
VERSIONS_DIR = "versions"
HEAD_FORMAT = 1


@dataclass(frozen=True, slots=True)
class Writer:
    """Who may publish: the epoch of its claim and who made it (`host:pid:nonce`)."""

    epoch: int
    owner: str

    def describe(self) -> str:
        return f"epoch {self.epoch} ({self.owner})"


@dataclass(frozen=True, slots=True)
class Head:
    """The published ledger: its writer, a sequence that grows with every head written (so no
    two heads are the same bytes), and the sha256 of each mutable file's version, by the file's
    path in a data directory (`segments/manifest.json`, `ledger.json`, …)."""

    writer: Writer
    sequence: int
    files: tuple[tuple[str, str], ...] = ()

    def file_map(self) -> dict[str, str]:
        return dict(self.files)

    def version_keys(self) -> set[str]:
        """The object keys of the versions this head names."""
        return {version_key(path, sha256) for path, sha256 in self.files}

    def encode(self) -> bytes:
        doc = {
            "format": HEAD_FORMAT,
            "writer": {"epoch": self.writer.epoch, "owner": self.writer.owner},
            "sequence": self.sequence,
            "files": dict(self.files),
        }
        return json.dumps(doc, indent=1, sort_keys=True).encode()


def version_key(path: str, sha256: str) -> str:
    """Where the version of the file at `path` whose content has `sha256` is stored."""
    return f"{VERSIONS_DIR}/{path}/{sha256}"


def segment_key(root: str, rel: str, sha256: str) -> str:
    """Where a segment file (or rollup) at `rel` under `root` whose content has `sha256` is
    stored under a head."""
    stem, dot, suffix = rel.rpartition(".")
    if not dot or "/" in suffix:
        return f"{root}/{rel}.{sha256[:16]}"
    return f"{root}/{stem}.{sha256[:16]}.{suffix}"


def decode_head(raw: bytes, where: str) -> Head:
    """The head in `raw` (read from `where`); a `SegmentError` naming the damage otherwise. A
    head of a newer format is refused: this build cannot know what else it names."""
    try:
        doc = json.loads(raw.decode())
        if doc["format"] != HEAD_FORMAT:
            raise SegmentError(
                f"{where}: head format {doc['format']!r}, this build reads {HEAD_FORMAT}: "
                "upgrade Tally to read this ledger"
            )
        writer = Writer(_int(doc["writer"]["epoch"]), str(doc["writer"]["owner"]))
        files = doc["files"]
        if not isinstance(files, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in files.items()
        ):
            raise TypeError("files: expected an object of strings")
        return Head(writer, _int(doc["sequence"]), tuple(sorted(files.items())))
    except SegmentError:
        raise
    except (UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise SegmentError(f"{where}: unreadable head: {exc}") from exc


def _int(value: object) -> int:
    if type(value) is not int or value < 0:
        raise TypeError(f"expected a non-negative integer, got {value!r}")
    return value


def new_owner() -> str:
    """A name for this process's claims: host, pid and a nonce (a pid is reused after a
    restart; the nonce is not)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class WriterFenced(StoreError):
    """Another writer claimed the published ledger after this one: this writer must stop
    publishing (nothing it stored since is read by anyone). Not retried."""

    def __init__(self, where: str, mine: Writer, current: Writer | None) -> None:
        holder = current.describe() if current is not None else "nobody (the head is gone)"
        super().__init__(
            f"{where}: this writer, {mine.describe()}, was fenced: the ledger is now held by "
            f"{holder}; stop, and start again to claim it anew"
        )
        self.where = where
        self.mine = mine
        self.current = current
