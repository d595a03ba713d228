"""The store's side files beside the segments: the readers' copy of the admin log, the record
and checksum of each closed period (the rules of a close are in `ledger.closing`), the
summary of the dead letters (`refused.json`: what the ledger refused, grouped by reason and
topic, for `tally report refused`), the GPU inventory (`inventory.json`: every GPU record as the
last seal found it, for `tally inventory list`), and the readers' copy of the audit trail
(`audit.jsonl`: one record per line, oldest first, only ever appended; `ledger.audit`)."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import duckdb
import orjson

from ledger import audit
from ledger.admin import AppliedAdmin, applied_from_dict, applied_to_dict
from ledger.audit import AuditRecord
from ledger.closing import CHECKSUM_COLUMNS, ClosedPeriod
from ledger.errors import EventError, SegmentError
from ledger.inventory import InventoryGpu
from ledger.inventory.state import record_from_dict, record_to_dict
from ledger.periods import Period
from ledger.store.layout import SEGMENTS_DIR
from ledger.store.segments import atomic_write_bytes

ADMIN_LOG_NAME = "admin-log.json"
ADMIN_LOG_VERSION = 1
REFUSED_NAME = "refused.json"
REFUSED_VERSION = 1
INVENTORY_NAME = "inventory.json"
INVENTORY_VERSION = 1
CLOSED_DIR = "closed"
AUDIT_NAME = "audit.jsonl"
# the side files a command reads alone (`ledger.store.side_pull`), by their path in a data
# directory
ADMIN_LOG_PATH = f"{SEGMENTS_DIR}/{ADMIN_LOG_NAME}"
INVENTORY_PATH = f"{SEGMENTS_DIR}/{INVENTORY_NAME}"
AUDIT_PATH = f"{SEGMENTS_DIR}/{AUDIT_NAME}"
_BATCH_ROWS = 65_536


def write_admin_log(segments_root: Path, entries: Iterable[AppliedAdmin]) -> None:
    """The readers' copy of the applied admin events, in the order they were applied."""
    doc = {"version": ADMIN_LOG_VERSION, "events": [applied_to_dict(e) for e in entries]}
    atomic_write_bytes(segments_root / ADMIN_LOG_NAME, orjson.dumps(doc))


def load_admin_log(segments_root: Path) -> list[AppliedAdmin]:
    path = segments_root / ADMIN_LOG_NAME
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return []
    return parse_admin_log(raw, str(path))


def parse_admin_log(raw: bytes, where: str) -> list[AppliedAdmin]:
    """The applied admin events of the admin log `raw` (read from `where`), in order."""
    try:
        doc = json.loads(raw)
        return [applied_from_dict(entry) for entry in doc["events"]]
    except (ValueError, KeyError, TypeError, EventError) as exc:
        raise SegmentError(f"{where}: unreadable admin log: {exc}") from exc


def append_audit_file(segments_root: Path, records: Iterable[AuditRecord], held: int | None) -> int:
    """Append to the readers' copy of the audit trail the records it does not hold yet, and
    return how many it holds. `held`: how many it holds, as the writer last left it; None
    (unknown, e.g. after a restart) reads the file to count them, cutting off a line torn by a
    crash first."""
    path = segments_root / AUDIT_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("ab+") as handle:
        if held is None:
            handle.seek(0)
            raw = handle.read()
            whole = raw.rfind(b"\n") + 1
            if whole != len(raw):
                handle.truncate(whole)
            held = raw.count(b"\n")
        fresh = [r for r in records if r.seq > held]
        if fresh:
            handle.write(b"".join(orjson.dumps(audit.record_to_dict(r)) + b"\n" for r in fresh))
            handle.flush()
            os.fsync(handle.fileno())
        return held + len(fresh)


def load_audit_file(segments_root: Path) -> list[AuditRecord]:
    """The audit trail as the readers' copy holds it (none yet: empty); raises SegmentError
    naming the line that is not a record."""
    path = segments_root / AUDIT_NAME
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return []
    return parse_audit(raw, str(path))


def parse_audit(raw: bytes, where: str) -> list[AuditRecord]:
    """The audit records of the audit trail `raw` (read from `where`), oldest first; raises
    SegmentError naming the line that is not a record."""
    records = []
    for number, line in enumerate(raw.splitlines(), start=1):
        try:
            records.append(audit.record_from_dict(orjson.loads(line)))
        except (orjson.JSONDecodeError, EventError, TypeError) as exc:
            raise SegmentError(f"{where}: line {number} is not an audit record: {exc}") from exc
    return records


def period_checksum(con: duckdb.DuckDBPyConnection, source: str, period: str) -> tuple[int, str]:
    """(rows, sha256) of the postings in `source` (a SQL relation) booked into `period`."""
    columns = ", ".join(f'"{c}" := "{c}"' for c in CHECKSUM_COLUMNS)
    cursor = con.execute(
        f"SELECT to_json(struct_pack({columns})) FROM {source} "
        "WHERE period = ? ORDER BY txn_id, leg",
        [period],
    )
    digest = hashlib.sha256()
    rows = 0
    while chunk := cursor.fetchmany(_BATCH_ROWS):
        rows += len(chunk)
        digest.update("".join(f"{line}\n" for (line,) in chunk).encode())
    return rows, digest.hexdigest()


def closed_period_path(segments_root: Path, period: str) -> Path:
    return segments_root / CLOSED_DIR / f"{Period.month(period).label}.json"


def write_closed_period(segments_root: Path, closed: ClosedPeriod) -> bool:
    """Write the record of a closed period unless it exists; True when it was written."""
    path = closed_period_path(segments_root, closed.period)
    if path.exists():
        return False
    atomic_write_bytes(path, json.dumps(asdict(closed), indent=1).encode())
    return True


def load_closed_periods(segments_root: Path) -> list[ClosedPeriod]:
    """Every closed-period record under `segments_root`, oldest period first."""
    folder = segments_root / CLOSED_DIR
    if not folder.is_dir():
        return []
    found = []
    for path in sorted(folder.glob("*.json")):
        try:
            found.append(ClosedPeriod(**json.loads(path.read_bytes())))
        except (ValueError, TypeError) as exc:
            raise SegmentError(f"{path}: unreadable closed-period record: {exc}") from exc
    return found


@dataclass(frozen=True, slots=True)
class RefusedGroup:
    """The dead letters of one kind of reason on one topic. `reason` is a letter's reason up to
    its first `": "` (what follows is the letter's own detail, e.g. `too late to deduplicate`
    and then the event's time and cutoff); `example` is the newest letter's whole reason;
    the times are when the ledger recorded the first and last of them (UTC µs)."""

    reason: str
    topic: str
    letters: int
    first_recorded_us: int
    last_recorded_us: int
    example: str


# Grouped in the writer's database: the readers' copy stays one row per group, however many.
REFUSED_SQL = (
    "SELECT split_part(reason, ': ', 1) AS kind, coalesce(topic, '') AS topic, count(*), "
    "min(recorded_at_us), max(recorded_at_us), arg_max(reason, recorded_at_us) "
    "FROM dead_letters GROUP BY ALL ORDER BY count(*) DESC, kind, topic"
)


def write_refused(segments_root: Path, groups: Iterable[RefusedGroup]) -> None:
    doc = {"version": REFUSED_VERSION, "groups": [asdict(g) for g in groups]}
    atomic_write_bytes(segments_root / REFUSED_NAME, orjson.dumps(doc))


def load_refused(segments_root: Path) -> list[RefusedGroup]:
    """The dead-letter summary as of the last seal (none: nothing refused yet)."""
    path = segments_root / REFUSED_NAME
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return []
    try:
        return [RefusedGroup(**group) for group in json.loads(raw)["groups"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise SegmentError(f"{path}: unreadable dead-letter summary: {exc}") from exc


def write_inventory(segments_root: Path, gpus: Iterable[InventoryGpu]) -> None:
    doc = {"version": INVENTORY_VERSION, "gpus": [record_to_dict(g) for g in gpus]}
    atomic_write_bytes(segments_root / INVENTORY_NAME, orjson.dumps(doc))


def load_inventory(segments_root: Path) -> list[InventoryGpu]:
    """The GPU inventory as of the last seal (none: nothing reported yet), by node and index."""
    path = segments_root / INVENTORY_NAME
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return []
    return parse_inventory(raw, str(path))


def parse_inventory(raw: bytes, where: str) -> list[InventoryGpu]:
    """The GPU records of the inventory `raw` (read from `where`), by node and index."""
    try:
        gpus = [record_from_dict(g) for g in orjson.loads(raw)["gpus"]]
    except (ValueError, KeyError, TypeError, EventError) as exc:
        raise SegmentError(f"{where}: unreadable inventory: {exc}") from exc
    return sorted(gpus, key=lambda g: (g.node, g.index, g.uuid))
