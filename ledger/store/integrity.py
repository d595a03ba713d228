"""Whether a sealed file still holds the bytes it was sealed with: its sha256 against the one its
manifest records, what the damage looks like when it does not, and the check readers make
before they read a segment.

`segment_damage` describes a damaged file in one phrase (missing, not a Parquet file, cut short,
or valid Parquet whose bytes changed since it was sealed); `tally ledger verify` reports it and
`require_intact` raises it as a `SegmentError` naming the file. Readers call `require_intact`
for every segment a query reads: each file is hashed once per process and then remembered by
its path, size, modification time and inode (with the checksum expected), so a reader that
queries again does not hash again. The writer remembers the files it writes itself. A file
changed in place without changing its size or modification time is caught by `verify`, which
always hashes.
"""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

from ledger.errors import SegmentError

PARQUET_MAGIC = b"PAR1"
_FOOTER = 8  # footer length (4 bytes, little-endian) + magic
_REMEMBERED_LIMIT = 200_000

_Key = tuple[str, int, int, int, str]
_intact: set[_Key] = set()
_lock = threading.Lock()


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def parquet_damage(path: Path) -> str:
    """What is wrong with the Parquet file at `path` whose checksum did not match, as far as
    its framing tells: too short, bad magic, a footer pointing past the file, or nothing (its
    bytes changed but it still reads as Parquet)."""
    with path.open("rb") as handle:
        head = handle.read(len(PARQUET_MAGIC))
        size = handle.seek(0, 2)
        if size < len(PARQUET_MAGIC) + _FOOTER:
            return f"not a Parquet file ({size} bytes: truncated)"
        handle.seek(size - _FOOTER)
        tail = handle.read(_FOOTER)
    if head != PARQUET_MAGIC:
        return "not a Parquet file (bad magic at the start)"
    if tail[4:] != PARQUET_MAGIC:
        return f"not a Parquet file (bad magic at the end: truncated or overwritten, {size} bytes)"
    footer = int.from_bytes(tail[:4], "little")
    if footer + _FOOTER + len(PARQUET_MAGIC) > size:
        return f"not a Parquet file (its footer of {footer} bytes runs past the file's {size})"
    return "a valid Parquet file whose bytes changed since it was sealed"


def segment_damage(path: Path, sha256: str) -> str | None:
    """None when the file at `path` holds the bytes its manifest's `sha256` records; else the
    damage in one phrase."""
    try:
        actual = file_sha256(path)
    except FileNotFoundError:
        return "listed in the manifest but missing"
    except OSError as exc:
        return f"unreadable: {exc.strerror or exc}"
    if actual == sha256:
        return None
    try:
        what = parquet_damage(path)
    except OSError as exc:
        what = f"unreadable: {exc.strerror or exc}"
    return f"checksum does not match the manifest: {what}"


def _key(path: Path, sha256: str) -> _Key:
    st = path.stat()
    return (str(path), st.st_size, st.st_mtime_ns, st.st_ino, sha256)


def remember_intact(path: Path, sha256: str) -> None:
    """Record that the file at `path` (as it is now) holds the bytes of `sha256`."""
    key = _key(path, sha256)
    with _lock:
        if len(_intact) >= _REMEMBERED_LIMIT:
            _intact.clear()
        _intact.add(key)


def require_intact(path: Path, sha256: str) -> Path:
    """`path`, once its bytes are known to match `sha256` (hashed on first sight in this
    process); else a `SegmentError` naming the file and the damage."""
    try:
        key = _key(path, sha256)
    except FileNotFoundError:
        raise SegmentError(f"{path}: listed in the manifest but missing") from None
    with _lock:
        if key in _intact:
            return path
    damage = segment_damage(path, sha256)
    if damage is not None:
        raise SegmentError(f"{path}: {damage} (see `tally ledger verify`)")
    with _lock:
        if len(_intact) >= _REMEMBERED_LIMIT:
            _intact.clear()
        _intact.add(key)
    return path


def forget_intact() -> None:
    """Forget every file known intact (the next read hashes again)."""
    with _lock:
        _intact.clear()
