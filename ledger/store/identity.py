"""What a ledger is, besides its events: the time zone its books are kept in
(`<data_dir>/ledger.json`, `{"version": 1, "timezone": "Asia/Shanghai"}`).

The time zone decides which month every posting is booked into, when a month's budget is
granted and what a closed period holds, so it is part of the ledger's identity: the writer
records it when it first opens a ledger (`claim_zone`) and refuses to open one whose books are
kept in another zone (`ZoneChanged`; there is no conversion: a ledger's periods, closes and
checksums would all change). A ledger made before the setting existed has no record and was
kept in UTC. Readers, `verify` and `rebuild` take the zone from here (`recorded_zone`), never
from the configuration, so a rebuild books into the same months as the live writer.
"""

from __future__ import annotations

import json
from datetime import UTC, tzinfo
from pathlib import Path

import orjson

from ledger.errors import StoreError
from ledger.periods import parse_zone, zone_name
from ledger.store.layout import has_ledger
from ledger.store.segments import atomic_write_bytes

IDENTITY_NAME = "ledger.json"
IDENTITY_VERSION = 1


class ZoneChanged(StoreError):
    """The configuration names another time zone than the ledger's books are kept in."""


def recorded_zone(data_dir: Path) -> tzinfo:
    """The time zone the ledger in `data_dir` keeps its books in (UTC when none is recorded)."""
    path = data_dir / IDENTITY_NAME
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return UTC
    return zone_of_record(raw, str(path))


def zone_of_record(raw: bytes | None, where: str) -> tzinfo:
    """The time zone the identity record `raw` (read from `where`) names; UTC when there is
    none (None)."""
    if raw is None:
        return UTC
    try:
        doc = json.loads(raw)
        return parse_zone(str(doc["timezone"]))
    except (ValueError, KeyError, TypeError) as exc:
        raise StoreError(f"{where}: unreadable ledger identity: {exc}") from exc


def check_zone(data_dir: Path, zone: tzinfo) -> None:
    """Raise `ZoneChanged` when the ledger in `data_dir` keeps its books in another zone than
    `zone` (nothing is written: a directory without a ledger passes)."""
    wanted = zone_name(zone)
    if (data_dir / IDENTITY_NAME).exists() or has_ledger(data_dir):
        kept = zone_name(recorded_zone(data_dir))
        if kept != wanted:
            raise ZoneChanged(
                f"the ledger in {data_dir} keeps its books in {kept}, the configuration says "
                f"ledger.timezone: {wanted}. A ledger's time zone cannot change (its periods, "
                f"budgets and closed months would move): set ledger.timezone: {kept}, or start "
                "a new ledger in another data directory"
            )


def claim_zone(data_dir: Path, zone: tzinfo) -> None:
    """Record `zone` as the ledger's time zone, or raise `ZoneChanged` when the ledger in
    `data_dir` keeps its books in another one (the writer calls it before it opens the
    ledger)."""
    check_zone(data_dir, zone)
    path = data_dir / IDENTITY_NAME
    if path.exists():
        return
    wanted = zone_name(zone)
    data_dir.mkdir(parents=True, exist_ok=True)
    doc = {"version": IDENTITY_VERSION, "timezone": wanted}
    atomic_write_bytes(path, orjson.dumps(doc))
