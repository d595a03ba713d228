"""The collector's disk spool: where messages wait while the broker cannot take them.

This module owns the spool's on-disk format, its durability, its size bound and what happens
when it is full, and recovery after a crash. It knows nothing of Kafka: a record is one message
(topic, key, value) and the number of samples it carries, so what is replayed is byte for byte
what would have been sent.

Layout: a directory of segment files `<n>.spool` (n increases and is never reused) and a
`cursor` file. A segment starts with the 8-byte magic `TSPOOL1\\n`, followed by records:

    u32 body length | u32 CRC-32 of the body | body
    body = u16 topic length | u16 key length | u32 samples | topic | key | value

(big-endian). `cursor` holds `<segment> <offset>`: the first record not yet acknowledged.
Records before it, and segments before its segment, are done and are deleted.

Durability (fsync policy):
- `append(records)` writes the records of one call with one write per segment and one fsync of
  each file written (normally one: one fsync per spooled flush). A new segment is fsync'd with
  its directory. When `append` returns, the records survive a crash or power loss.
- `remove(count)` is called after the broker acknowledged the first `count` records; it rewrites
  `cursor` (temporary file, fsync, rename, fsync of the directory). A crash before that resends
  those records, which is harmless: event ids are content-derived and the ledger drops
  duplicate ids.

Recovery on open: every segment is read and every record's length and CRC checked. The first
record that is cut short, has an impossible length or a CRC mismatch ends its segment: the file
is truncated there (a torn tail after a crash), and the bytes cut are logged and reported in
`Spool.recovery`. A segment without the magic is deleted whole.

Size bound (policy when full): the records not yet acknowledged take at most `max_bytes`. An
append that would go over first drops the OLDEST records, whole records oldest first, until the
new ones fit; a single record larger than `max_bytes` is refused. Every drop is reported to
`on_drop(reason, records, samples)` (the producer logs it and counts it on its metrics); nothing
is dropped silently. On disk the spool takes at most one segment more than `max_bytes` (the
consumed head of the oldest segment, freed when the cursor leaves it).
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import zlib
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import BinaryIO

from collectors.errors import SpoolError

log = logging.getLogger("tally.collector.spool")

MAGIC = b"TSPOOL1\n"
SUFFIX = ".spool"
CURSOR = "cursor"
DEFAULT_MAX_BYTES = 256 << 20
_FRAME = struct.Struct(">II")  # body length, CRC-32 of the body
_BODY = struct.Struct(">HHI")  # topic length, key length, samples
_MAX_BODY = 64 << 20  # no message is near this; a larger length is a corrupt header


class DropReason(StrEnum):
    """Why records left the spool without reaching the broker."""

    FULL = "spool_full"
    TOO_LARGE = "too_large"
    CORRUPT = "corrupt"


@dataclass(frozen=True, slots=True)
class SpoolRecord:
    """One message as it goes to the broker, and the samples it carries."""

    topic: str
    key: bytes
    value: bytes
    samples: int


@dataclass(frozen=True, slots=True)
class Recovery:
    """What opening the spool found: segments cut at a bad record, and the bytes cut."""

    truncated_segments: tuple[int, ...] = ()
    truncated_bytes: int = 0


@dataclass(frozen=True, slots=True)
class _Entry:
    segment: int
    offset: int
    size: int  # frame included
    samples: int


OnDrop = Callable[[DropReason, int, int], None]


def _log_drop(reason: DropReason, records: int, samples: int) -> None:
    log.warning("spool dropped %d records (%d samples): %s", records, samples, reason.value)


def encode_record(record: SpoolRecord) -> bytes:
    """The bytes of one record on disk, frame included."""
    topic = record.topic.encode()
    body = b"".join(
        (_BODY.pack(len(topic), len(record.key), record.samples), topic, record.key, record.value)
    )
    return _FRAME.pack(len(body), zlib.crc32(body)) + body


def _decode_body(body: bytes) -> SpoolRecord:
    topic_len, key_len, samples = _BODY.unpack_from(body)
    start = _BODY.size
    topic = body[start : start + topic_len].decode()
    key = body[start + topic_len : start + topic_len + key_len]
    return SpoolRecord(topic, key, body[start + topic_len + key_len :], samples)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Spool:
    """An append-only, size-bounded, crash-safe queue of records in a directory.

    Not thread-safe: one collector owns one spool directory.
    """

    def __init__(
        self,
        directory: Path | str,
        max_bytes: int = DEFAULT_MAX_BYTES,
        segment_bytes: int | None = None,
        on_drop: OnDrop = _log_drop,
    ) -> None:
        if max_bytes <= len(MAGIC) + _FRAME.size:
            raise ValueError(f"spool max_bytes {max_bytes} is too small")
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes or max(64 << 10, max_bytes // 16)
        self.on_drop = on_drop
        self._entries: deque[_Entry] = deque()
        self._bytes = 0
        self._samples = 0
        self._sizes: dict[int, int] = {}  # segment -> file size
        self._writer: BinaryIO | None = None
        self._cursor = (0, 0)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self.recovery = self._open()
        except OSError as exc:
            raise SpoolError(f"cannot open the spool in {self.directory}: {exc}") from exc

    # ------------------------------------------------------------------------------ state

    @property
    def records(self) -> int:
        return len(self._entries)

    @property
    def samples(self) -> int:
        return self._samples

    @property
    def live_bytes(self) -> int:
        """Bytes of the records not yet acknowledged (what `max_bytes` bounds)."""
        return self._bytes

    @property
    def disk_bytes(self) -> int:
        return sum(self._sizes.values())

    # ------------------------------------------------------------------------------ open

    def _segment_path(self, number: int) -> Path:
        return self.directory / f"{number:016d}{SUFFIX}"

    def _read_cursor(self) -> tuple[int, int]:
        path = self.directory / CURSOR
        try:
            segment, offset = path.read_text().split()
            return int(segment), int(offset)
        except FileNotFoundError:
            return 0, 0
        except ValueError:
            log.warning("spool cursor %s is unreadable: replaying the whole spool", path)
            return 0, 0

    def _open(self) -> Recovery:
        self._cursor = self._read_cursor()
        numbers = sorted(int(p.stem) for p in self.directory.glob(f"*{SUFFIX}") if p.stem.isdigit())
        truncated: list[int] = []
        cut = 0
        for number in numbers:
            path = self._segment_path(number)
            if number < self._cursor[0]:
                path.unlink()
                continue
            with path.open("r+b") as f:
                data = f.read()
                if not data.startswith(MAGIC):
                    log.error("spool segment %s has no spool header: deleted", path)
                    path.unlink()
                    cut += len(data)
                    truncated.append(number)
                    continue
                end = self._scan(number, data)
                if end < len(data):
                    f.truncate(end)
                    f.flush()
                    os.fsync(f.fileno())
                    log.warning(
                        "spool segment %s: %d bytes after offset %d are a torn or corrupt "
                        "record: cut",
                        path,
                        len(data) - end,
                        end,
                    )
                    cut += len(data) - end
                    truncated.append(number)
            self._sizes[number] = end
        if self._entries:
            log.info(
                "spool %s holds %d records (%d samples) to replay",
                self.directory,
                len(self._entries),
                self._samples,
            )
        return Recovery(tuple(truncated), cut)

    def _scan(self, number: int, data: bytes) -> int:
        """Index the valid records of one segment; returns where the valid records end."""
        offset = len(MAGIC)
        skip_before = self._cursor[1] if number == self._cursor[0] else 0
        while offset + _FRAME.size <= len(data):
            length, crc = _FRAME.unpack_from(data, offset)
            start = offset + _FRAME.size
            if length < _BODY.size or length > _MAX_BODY or start + length > len(data):
                break
            body = data[start : start + length]
            if zlib.crc32(body) != crc:
                break
            if offset >= skip_before:
                samples = _BODY.unpack_from(body)[2]
                self._push(_Entry(number, offset, _FRAME.size + length, samples))
            offset = start + length
        return offset

    def _push(self, entry: _Entry) -> None:
        self._entries.append(entry)
        self._bytes += entry.size
        self._samples += entry.samples

    def _pop(self) -> _Entry:
        entry = self._entries.popleft()
        self._bytes -= entry.size
        self._samples -= entry.samples
        return entry

    # ------------------------------------------------------------------------------ write

    def append(self, records: Sequence[SpoolRecord]) -> None:
        """Spool `records` after those already held; durable when this returns."""
        frames: list[tuple[bytes, int]] = []
        for record in records:
            frame = encode_record(record)
            if len(frame) > self.max_bytes:
                self.on_drop(DropReason.TOO_LARGE, 1, record.samples)
                continue
            frames.append((frame, record.samples))
        if not frames:
            return
        incoming = sum(len(f) for f, _ in frames)
        # The newest records win: what does not fit is dropped from the oldest end.
        while incoming > self.max_bytes:
            frame, samples = frames.pop(0)
            incoming -= len(frame)
            self.on_drop(DropReason.FULL, 1, samples)
        try:
            self._make_room(incoming)
            self._write(frames)
        except OSError as exc:
            raise SpoolError(f"cannot write the spool in {self.directory}: {exc}") from exc

    def _make_room(self, incoming: int) -> None:
        records = samples = 0
        while self._entries and self._bytes + incoming > self.max_bytes:
            entry = self._pop()
            records += 1
            samples += entry.samples
        if records:
            self._advance()
            self.on_drop(DropReason.FULL, records, samples)

    def _write(self, frames: list[tuple[bytes, int]]) -> None:
        writer, number = self._active()
        group: list[tuple[bytes, int]] = []
        for frame, samples in frames:
            used = self._sizes[number] + sum(len(f) for f, _ in group)
            if used > len(MAGIC) and used + len(frame) > self.segment_bytes:
                self._commit(writer, number, group)
                group = []
                writer, number = self._roll()
            group.append((frame, samples))
        self._commit(writer, number, group)

    def _commit(self, writer: BinaryIO, number: int, group: list[tuple[bytes, int]]) -> None:
        """Write and fsync one segment's share of an append; index the records once durable."""
        if not group:
            return
        offset = self._sizes[number]
        try:
            writer.write(b"".join(f for f, _ in group))
            writer.flush()
            os.fsync(writer.fileno())
        except OSError:
            # Leave the file as the index knows it, so the next append starts clean.
            self._writer = None
            with contextlib.suppress(OSError):
                writer.close()
            with contextlib.suppress(OSError):
                os.truncate(self._segment_path(number), offset)
            raise
        for frame, samples in group:
            self._push(_Entry(number, offset, len(frame), samples))
            offset += len(frame)
        self._sizes[number] = offset

    def _active(self) -> tuple[BinaryIO, int]:
        if self._writer is not None:
            return self._writer, max(self._sizes)
        if self._sizes:
            number = max(self._sizes)
            writer = self._segment_path(number).open("ab")
            if writer.tell() != self._sizes[number]:  # pragma: no cover - a foreign writer
                writer.close()
                raise SpoolError(f"spool segment {number} changed under the collector")
            self._writer = writer
            return writer, number
        return self._roll()

    def _roll(self) -> tuple[BinaryIO, int]:
        if self._writer is not None:
            self._writer.close()
        number = max([*self._sizes, self._cursor[0]]) + 1
        path = self._segment_path(number)
        writer = path.open("xb")
        writer.write(MAGIC)
        writer.flush()
        os.fsync(writer.fileno())
        _fsync_dir(self.directory)
        self._writer = writer
        self._sizes[number] = len(MAGIC)
        return writer, number

    # ------------------------------------------------------------------------------ replay

    def peek(self, max_records: int, max_bytes: int = 8 << 20) -> list[SpoolRecord]:
        """The oldest records (at least one when any), oldest first; they stay until `remove`.

        A record whose CRC no longer matches (the file changed on disk after it was opened) is
        dropped and reported as corrupt; the records after it are not affected.
        """
        out: list[SpoolRecord] = []
        taken = 0
        handles: dict[int, BinaryIO] = {}
        try:
            index = 0
            while index < len(self._entries) and len(out) < max_records:
                entry = self._entries[index]
                if out and taken + entry.size > max_bytes:
                    break
                f = handles.get(entry.segment)
                if f is None:
                    f = handles[entry.segment] = self._segment_path(entry.segment).open("rb")
                f.seek(entry.offset)
                raw = f.read(entry.size)
                record = self._check(raw)
                if record is None:
                    del self._entries[index]
                    self._bytes -= entry.size
                    self._samples -= entry.samples
                    log.error(
                        "spool record at %d in segment %d fails its CRC check",
                        entry.offset,
                        entry.segment,
                    )
                    self.on_drop(DropReason.CORRUPT, 1, entry.samples)
                    continue
                out.append(record)
                taken += entry.size
                index += 1
        except OSError as exc:
            raise SpoolError(f"cannot read the spool in {self.directory}: {exc}") from exc
        finally:
            for f in handles.values():
                f.close()
        return out

    @staticmethod
    def _check(raw: bytes) -> SpoolRecord | None:
        if len(raw) < _FRAME.size + _BODY.size:
            return None
        length, crc = _FRAME.unpack_from(raw)
        body = raw[_FRAME.size :]
        if length != len(body) or zlib.crc32(body) != crc:
            return None
        return _decode_body(body)

    def remove(self, count: int) -> None:
        """Forget the `count` oldest records: the broker acknowledged them."""
        if count <= 0:
            return
        if count > len(self._entries):
            raise ValueError(f"cannot remove {count} of {len(self._entries)} spooled records")
        for _ in range(count):
            self._pop()
        try:
            self._advance()
        except OSError as exc:
            raise SpoolError(f"cannot update the spool cursor: {exc}") from exc

    def _advance(self) -> None:
        """Persist the cursor at the oldest record held, then delete the segments behind it."""
        if self._entries:
            head = self._entries[0]
            cursor = (head.segment, head.offset)
        elif self._sizes:
            newest = max(self._sizes)
            cursor = (newest, self._sizes[newest])
        else:
            cursor = self._cursor
        self._cursor = cursor
        tmp = self.directory / (CURSOR + ".tmp")
        with tmp.open("w") as f:
            f.write(f"{cursor[0]} {cursor[1]}\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.directory / CURSOR)
        _fsync_dir(self.directory)
        for number in sorted(self._sizes):
            if number < cursor[0] or (not self._entries and number == cursor[0]):
                if number == cursor[0] and self._writer is not None:
                    self._writer.close()
                    self._writer = None
                self._segment_path(number).unlink()
                del self._sizes[number]

    def close(self) -> None:
        if self._writer is not None:
            with contextlib.suppress(OSError):
                self._writer.close()
            self._writer = None

    def __enter__(self) -> Spool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
