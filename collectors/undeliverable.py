"""The collector's record of messages the broker refused for their content (too large,
corrupt): one JSON line each, appended to `undeliverable.jsonl` beside the spool, so what was
dropped can be found again (the counter `tally_collector_samples_dropped_total{reason="rejected"}`
says how many samples; this says which messages).

A line holds the topic, key, size and sha256 of the message, how many samples it carried, and
its first 2 KiB; a refused message of any size makes a line of a few KiB.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import orjson

from collectors.spool import SpoolRecord
from ledger.excerpts import ID_LIMIT, TEXT_LIMIT, bounded

FILE_NAME = "undeliverable.jsonl"


def record_undeliverable(path: Path, message: SpoolRecord, reason: str) -> None:
    """Append one line for `message` to `path` (its directory is made if missing)."""
    line = {
        "time_us": time.time_ns() // 1_000,
        "topic": bounded(message.topic, ID_LIMIT),
        "key": bounded(message.key.decode("utf-8", "replace"), ID_LIMIT),
        "samples": message.samples,
        "bytes": len(message.value),
        "sha256": hashlib.sha256(message.value).hexdigest(),
        "reason": bounded(reason),
        "value_start": message.value[:TEXT_LIMIT].decode("utf-8", "replace"),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("ab") as out:
        out.write(orjson.dumps(line) + b"\n")


def read_undeliverable(path: Path) -> list[dict[str, object]]:
    """Every line recorded in `path`, oldest first."""
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return []
    return [orjson.loads(line) for line in text.splitlines() if line.strip()]
