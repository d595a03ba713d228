"""Reading the jobs topic: the messages of the scheduler's `jobs` topic out of the sealed
raw-event archive (`archive/`, see `ledger.store.segments`), decoded with `ledger.job_events`
(`job_event_log`) into a `JobEventLog`; hold events, which share the topic, are passed over.

`read_job_event_log` is the only reader of files in the job history; a value the archive keeps
compressed (a large one, `ledger.store.schema.archived_value`) is decompressed first; events
are returned in publication order (batch sequence, then position in the batch), a resend
counted once. Each archive file is checked against its manifest's checksum first: a damaged or
missing one raises a `SegmentError` naming it.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import orjson
import pyarrow.parquet as pq

from ledger.errors import EventError, SegmentError
from ledger.job_events import JobEnvelope, JobEvent, decode_job_event, job_envelope_from_dict
from ledger.store.integrity import require_intact
from ledger.store.layout import ARCHIVE_DIR
from ledger.store.schema import archived_value
from ledger.store.segments import Manifest

DEFAULT_JOBS_TOPIC = "tally.jobs"
_READ_RETRIES = 3
_CACHED_FILES = 1024
_JOB_PREFIX = "tally.job."
_GPU_PREFIX = "tally.gpu."


@dataclass(frozen=True, slots=True)
class JobEventLog:
    """The job events of the jobs topic, in publication order, each once.

    `messages`: jobs-topic messages read; `undecodable`: messages or array items that claim to
    be job events (or are not JSON) but fail `ledger.job_events`' validation; `newest_us`: the
    latest event time (None without events).
    """

    events: tuple[JobEvent, ...] = ()
    messages: int = 0
    undecodable: int = 0
    newest_us: int | None = None


def job_envelopes(value: bytes | None) -> tuple[tuple[JobEnvelope, ...], int]:
    """The job events in one jobs-topic message value (one envelope, or an array of them), and
    how many items were undecodable. Hold events and other types are passed over; never raises.
    """
    if not value:
        return (), 1
    try:
        return (decode_job_event(value),), 0
    except EventError:
        pass  # not a single job event: an array, a hold event, or bad input (sorted out below)
    try:
        parsed = orjson.loads(value)
    except orjson.JSONDecodeError:
        return (), 1
    items = parsed if type(parsed) is list else [parsed]
    found: list[JobEnvelope] = []
    bad = 0
    for item in items:
        kind = item.get("type") if type(item) is dict else None
        if type(kind) is str and not kind.startswith((_JOB_PREFIX, _GPU_PREFIX)):
            continue  # a hold event (`ledger.holds`) or another producer's type
        try:
            found.append(job_envelope_from_dict(item))
        except EventError:
            bad += 1
    return tuple(found), bad


def job_event_log(values: Iterable[bytes | None]) -> JobEventLog:
    """Decode jobs-topic message values given in publication order; resent events count once."""
    seen: set[str] = set()
    events: list[JobEvent] = []
    messages = bad = 0
    for value in values:
        messages += 1
        envelopes, undecodable = job_envelopes(value)
        bad += undecodable
        for envelope in envelopes:
            if envelope.id not in seen:
                seen.add(envelope.id)
                events.append(envelope.data)
    newest = max((e.time_us for e in events), default=None)
    return JobEventLog(tuple(events), messages, bad, newest)


_Decoded = tuple[tuple[int, int, tuple[JobEnvelope, ...], int], ...]


@functools.lru_cache(maxsize=_CACHED_FILES)
def _archive_file(path: str, sha256: str, topic: str) -> _Decoded:
    """(batch sequence, position, job envelopes, undecodable) per message of one archive file.

    Archive files are immutable and named by their offset range; the checksum in the key makes
    a rewritten file (a re-seal after a crash writes the same bytes) a cache hit only when equal.
    """
    del sha256  # part of the cache key only
    columns = ["batch_seq", "batch_index", "topic", "value", "value_codec", "value_size"]
    table = pq.read_table(path, columns=columns)
    out = []
    for seq, index, msg_topic, value, codec, size in zip(
        *(table.column(i).to_pylist() for i in range(len(columns))), strict=True
    ):
        if msg_topic == topic:
            envelopes, bad = job_envelopes(archived_value(value, codec, size))
            out.append((int(seq), int(index), envelopes, bad))
    return tuple(out)


def read_job_event_log(data_dir: Path | str, topic: str = DEFAULT_JOBS_TOPIC) -> JobEventLog:
    """The job events of `topic` in the sealed raw-event archive of the ledger in `data_dir`.

    Reads only the archive segments the archive manifest lists for `topic` (what the ledger
    worker consumed and sealed; the writer's hot database is never opened). A file compacted
    away between reading the manifest and the file is retried with the new manifest.
    """
    root = Path(data_dir) / ARCHIVE_DIR
    last: OSError | SegmentError | None = None
    for _ in range(_READ_RETRIES):
        infos = [s for s in Manifest(root).load() if s.topic == topic]
        try:
            decoded = [
                _archive_file(str(require_intact(root / s.path, s.sha256)), s.sha256, topic)
                for s in infos
            ]
            break
        except (OSError, SegmentError) as exc:  # a file compacted away meanwhile, or damaged
            last = exc
    else:
        if isinstance(last, SegmentError):
            raise last
        raise EventError(f"the raw-event archive could not be read: {last}")
    rows = sorted((row for part in decoded for row in part), key=lambda r: (r[0], r[1]))
    seen: set[str] = set()
    events: list[JobEvent] = []
    bad = 0
    for _, _, envelopes, undecodable in rows:
        bad += undecodable
        for envelope in envelopes:
            if envelope.id not in seen:
                seen.add(envelope.id)
                events.append(envelope.data)
    newest = max((e.time_us for e in events), default=None)
    return JobEventLog(tuple(events), len(rows), bad, newest)
