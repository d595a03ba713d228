"""The delivery log: what was queued, sent and dropped per sink and alert id, kept across restarts
in `<data_dir>/alerts/deliveries.jsonl` (appended and fsynced).

It is what makes delivery at-least-once per sink and deduplicated by alert id: a copy is recorded
`queued` before the topic offset is committed, `sent` after a 2xx answer, or `dropped` with the
reason (`DropReason`). Copies still `queued` at a restart are queued again.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import orjson

from ledger.errors import EventError
from ledger.fleet_alerts import AnyAlert, any_alert_to_dict, decode_any_alert, one_shot

log = logging.getLogger("tally.alerts")

LOG_DIR = "alerts"
LOG_NAME = "deliveries.jsonl"
KEEP_DELIVERED_US = 30 * 86_400_000_000  # delivery records older than this are compacted away


class DeliveryState(StrEnum):
    QUEUED = "queued"
    SENT = "sent"
    DROPPED = "dropped"


class DropReason(StrEnum):
    QUEUE_FULL = "queue_full"
    GAVE_UP = "gave_up"
    REJECTED = "rejected"


@dataclass(frozen=True, slots=True)
class Delivery:
    sink: str
    alert: AnyAlert
    state: DeliveryState
    reason: str | None = None


class DeliveryLog:
    """What was queued, sent and dropped per sink and alert id: an append-only JSON-lines file.

    Each line is one state change; the latest line of a (sink, id) wins. A torn last line (a
    crash mid-write) is ignored. On open the file is rewritten with one line per (sink, id),
    leaving out finished deliveries older than `KEEP_DELIVERED_US` (by alert time) unless
    their episode is still open.
    """

    def __init__(self, data_dir: Path | str, now_us: int | None = None) -> None:
        self.path = Path(data_dir) / LOG_DIR / LOG_NAME
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, str], Delivery] = {}
        self._load()
        self._compact(now_us if now_us is not None else time.time_ns() // 1_000)
        self._handle = self.path.open("ab")

    def _load(self) -> None:
        try:
            lines = self.path.read_bytes().splitlines()
        except FileNotFoundError:
            return
        for line in lines:
            try:
                doc = orjson.loads(line)
                alert = decode_any_alert(orjson.dumps(doc["alert"]))
                entry = Delivery(
                    str(doc["sink"]), alert, DeliveryState(doc["state"]), doc.get("reason")
                )
            except (orjson.JSONDecodeError, EventError, KeyError, ValueError, TypeError):
                log.warning("%s: skipping an unreadable line", self.path)
                continue
            self._entries[(entry.sink, alert.id)] = entry

    def _compact(self, now_us: int) -> None:
        open_episodes = {
            (d.sink, d.alert.episode)
            for d in self._entries.values()
            if not d.alert.resolved and not one_shot(d.alert)
        } - {(d.sink, d.alert.episode) for d in self._entries.values() if d.alert.resolved}
        keep = {
            key: d
            for key, d in self._entries.items()
            if d.state is DeliveryState.QUEUED
            or now_us - d.alert.at_us < KEEP_DELIVERED_US
            or (d.sink, d.alert.episode) in open_episodes
        }
        self._entries = keep
        tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        with tmp.open("wb") as handle:
            for d in keep.values():
                handle.write(_line(d))
            handle.flush()
            os.fsync(handle.fileno())
        tmp.replace(self.path)

    def known(self, sink: str, alert_id: str) -> bool:
        with self._lock:
            return (sink, alert_id) in self._entries

    def record(self, entries: Iterable[Delivery]) -> None:
        """Append state changes and make them durable (one fsync per call)."""
        with self._lock:
            wrote = False
            for d in entries:
                self._entries[(d.sink, d.alert.id)] = d
                self._handle.write(_line(d))
                wrote = True
            if wrote:
                self._handle.flush()
                os.fsync(self._handle.fileno())

    def pending(self, sink: str) -> list[AnyAlert]:
        """Alerts queued for `sink` and neither sent nor dropped, oldest first."""
        with self._lock:
            found = [
                d.alert
                for d in self._entries.values()
                if d.sink == sink and d.state is DeliveryState.QUEUED
            ]
        return sorted(found, key=lambda a: (a.at_us, a.id))

    def firing(self, sink: str) -> list[AnyAlert]:
        """Detections sent to `sink` whose resolution has not been sent (one-shot alerts, which
        are never resolved, are not firing)."""
        with self._lock:
            sent = [
                d.alert
                for d in self._entries.values()
                if d.sink == sink and d.state is DeliveryState.SENT
            ]
        resolved = {a.episode for a in sent if a.resolved}
        return [a for a in sent if not a.resolved and not one_shot(a) and a.episode not in resolved]

    def state(self, sink: str, alert_id: str) -> Delivery | None:
        with self._lock:
            return self._entries.get((sink, alert_id))

    def close(self) -> None:
        with self._lock:
            self._handle.close()


def _line(d: Delivery) -> bytes:
    doc = {
        "sink": d.sink,
        "state": d.state.value,
        "reason": d.reason,
        "alert": any_alert_to_dict(d.alert),
    }
    return orjson.dumps(doc) + b"\n"
