"""`GET /v1/jobs` pages: filters (`JobFilter`), a stable order (submit time, then job id) and
opaque cursors (`Cursors`).

A cursor is the position of the last job of a page, signed (HMAC-SHA256, a key made when the
API starts) together with the caller and the filters it was made for: a cursor that was
altered, or is used with other filters, by another caller or after a restart, is refused (400)
rather than silently starting somewhere else. Jobs are never removed, and a new job is
submitted after every job already listed, so following cursors from the first page visits
every job that matches exactly once.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import orjson

from ledger.events import MAX_TIME_US
from scheduler.api.responses import ApiError
from scheduler.records import JobRecord, JobState

Position = tuple[int, str]  # (submit µs, job id)
DIGITS = re.compile(r"[0-9]{1,19}")
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
BAD_CURSOR = (
    "cursor: not valid for this query (altered, made for other filters or another caller, or "
    "by an earlier run of the scheduler); start again without a cursor"
)


def parse_since(text: str) -> int:
    """`since=`: RFC 3339 with a time zone (`2026-11-01T00:00:00Z`) or integer µs since the
    epoch; raises ApiError(400)."""
    if DIGITS.fullmatch(text):
        value = int(text)
    else:
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            raise ApiError(
                400, "since: expected RFC 3339 (2026-11-01T00:00:00Z) or integer µs"
            ) from None
        if moment.tzinfo is None:
            raise ApiError(400, "since: give a time zone (Z or ±hh:mm)")
        value = (moment - EPOCH) // timedelta(microseconds=1)
    if not 0 <= value <= MAX_TIME_US:
        raise ApiError(400, f"since: out of range [0, {MAX_TIME_US}] µs")
    return value


@dataclass(frozen=True, slots=True)
class JobFilter:
    """Which jobs a page lists; None: any."""

    team: str | None = None
    state: JobState | None = None
    queue: str | None = None
    user: str | None = None
    since_us: int | None = None

    def matches(self, record: JobRecord) -> bool:
        spec = record.spec
        return (
            (self.team is None or spec.team == self.team)
            and (self.state is None or record.state is self.state)
            and (self.queue is None or spec.queue == self.queue)
            and (self.user is None or spec.user == self.user)
            and (self.since_us is None or spec.submit_us >= self.since_us)
        )

    def signature(self) -> bytes:
        return orjson.dumps(
            [self.team, None if self.state is None else self.state.value, self.queue, self.user,
             self.since_us]
        )  # fmt: skip


def position(record: JobRecord) -> Position:
    return (record.spec.submit_us, record.job_id)


def page(
    records: Iterable[JobRecord], where: JobFilter, after: Position | None, limit: int
) -> tuple[list[JobRecord], Position | None]:
    """Up to `limit` matching records after `after`, in order, and the position to continue
    from (None: there are no more)."""
    chosen = sorted(
        (r for r in records if where.matches(r) and (after is None or position(r) > after)),
        key=position,
    )
    if len(chosen) <= limit:
        return chosen, None
    shown = chosen[:limit]
    return shown, position(shown[-1])


class Cursors:
    """Signs and checks cursors with a key of its own (made at start)."""

    def __init__(self, key: bytes | None = None) -> None:
        self._key = key or secrets.token_bytes(32)

    def _mac(self, payload: bytes, caller: str, where: JobFilter) -> str:
        message = payload + b"\x1f" + caller.encode() + b"\x1f" + where.signature()
        digest = hmac.new(self._key, message, hashlib.sha256).digest()[:16]
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")

    def make(self, at: Position, caller: str, where: JobFilter) -> str:
        payload = base64.urlsafe_b64encode(orjson.dumps(list(at))).rstrip(b"=")
        return f"{payload.decode()}.{self._mac(payload, caller, where)}"

    def read(self, cursor: str, caller: str, where: JobFilter) -> Position:
        """The position a cursor names; raises ApiError(400) for one this API did not make for
        this caller and these filters."""
        payload, _, mac = cursor.partition(".")
        raw = payload.encode("ascii", "replace")
        if not hmac.compare_digest(
            mac.encode("ascii", "replace"), self._mac(raw, caller, where).encode()
        ):
            raise ApiError(400, BAD_CURSOR)
        try:
            decoded = orjson.loads(base64.urlsafe_b64decode(raw + b"=" * (-len(raw) % 4)))
        except (binascii.Error, ValueError):
            raise ApiError(400, BAD_CURSOR) from None
        if (
            type(decoded) is not list
            or len(decoded) != 2
            or type(decoded[0]) is not int
            or type(decoded[1]) is not str
        ):
            raise ApiError(400, BAD_CURSOR)
        return (decoded[0], decoded[1])
