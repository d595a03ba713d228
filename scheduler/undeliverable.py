"""The scheduler's record of `jobs` messages the broker refused for their content (too large,
corrupt): one JSON line each, appended to `<work_dir>/undeliverable.jsonl`, so an operator can
see what never reached the topic (and what a replay will therefore not know).

A line holds the message's `tally-seq`, key, event type and job (or GPU), its size and sha256,
the broker's reason and the value's first 2 KiB, every text bounded (`ledger.excerpts`): a
refused message of any size makes a line of a few KiB.
"""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import orjson

from ledger.excerpts import ID_LIMIT, TEXT_LIMIT, bounded
from scheduler.jobs_topic import Outgoing

FILE_NAME = "undeliverable.jsonl"


class UndeliverableLog:
    """Appends one line per refused message to `path` (its directory is made on the first)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def record(self, message: Outgoing, reason: str, time_us: int) -> None:
        event = message.event
        line = {
            "time_us": time_us,
            "seq": message.seq,
            "key": bounded(message.key.decode("utf-8", "replace"), ID_LIMIT),
            "event": type(event).__name__,
            "job_id": bounded(str(getattr(event, "job_id", "")), ID_LIMIT) or None,
            "bytes": len(message.value),
            "sha256": hashlib.sha256(message.value).hexdigest(),
            "reason": bounded(reason, TEXT_LIMIT),
            "value_start": message.value[:TEXT_LIMIT].decode("utf-8", "replace"),
        }
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("ab") as out:
                out.write(orjson.dumps(line) + b"\n")

    def entries(self) -> list[dict[str, object]]:
        """Every line recorded so far, oldest first."""
        try:
            text = self.path.read_bytes()
        except FileNotFoundError:
            return []
        return [orjson.loads(line) for line in text.splitlines() if line.strip()]
