"""How several shards of one published ledger read as one: the rules, as values in and values
out (`ledger.store.union` applies them to a read cache, `ledger.store.union_verify` checks a
cache against them).

A *shard* is a complete published ledger — its own head, manifests, side files and objects —
under the key prefix `shards/<name>/` of one store (`shards/samples-<p>` per samples partition,
`shards/global` for the admin, jobs and inventory topics). A ledger published at the store's
root beside shards (the one ledger of a store before it was sharded) is one more shard, named
`_root` (a shard's own name starts with a letter or digit, so none can take it). The union:

- lists every shard's segments (and archive segments), each entry's paths prefixed with
  `shards/<name>/` (`shard_entry`);
- keeps its books in the one time zone every shard records (`common_zone`: shards that
  disagree are an error naming both);
- takes the admin log, the inventory and the audit trail from the global shard — or, where
  there is none, from the root ledger; with neither they are empty (`side_source`);
- sums the dead-letter summaries (`summed_refused`);
- shows a period closed only when every shard has its closed record (`closed_in_union`); the
  union's record carries the close's event, actor and reason from the global shard's (or the
  first shard's) record, and the rows and checksum of the union's postings of the period, so
  the union is a ledger `verify` and `rebuild` can read like any other.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from ledger.closing import ClosedPeriod
from ledger.errors import SegmentError
from ledger.store.rollup_files import RollupInfo
from ledger.store.segments import SegmentInfo
from ledger.store.side_files import RefusedGroup

SHARDS_PREFIX = "shards"  # in the store, and in the union's trees
GLOBAL_SHARD = "global"
ROOT_SHARD = "_root"
_HEAD_KEY = re.compile(r"shards/([A-Za-z0-9][A-Za-z0-9._-]*)/head\.json")


def shard_of_head_key(key: str) -> str | None:
    """The shard whose head is the store's object `key` (`shards/<name>/head.json`); None for
    any other key (a segment, a version, a head nested deeper)."""
    found = _HEAD_KEY.fullmatch(key)
    return None if found is None else found.group(1)


def ordered(names: Iterable[str]) -> list[str]:
    """Shards in the union's order: the global shard, the root ledger, then by name."""
    rank = {GLOBAL_SHARD: 0, ROOT_SHARD: 1}
    return sorted(set(names), key=lambda n: (rank.get(n, 2), n))


def shard_prefix(name: str) -> str:
    """Where a shard's files lie under a union's segments and archive roots."""
    return f"{SHARDS_PREFIX}/{name}"


def shard_entry(seg: SegmentInfo, name: str) -> SegmentInfo:
    """A shard's manifest entry as the union lists it: every path it names (the segment, its
    rollups of every level, known or not) under `shards/<name>/`."""
    prefix = shard_prefix(name)

    def moved(rollup: RollupInfo | None) -> RollupInfo | None:
        return None if rollup is None else replace(rollup, path=f"{prefix}/{rollup.path}")

    return replace(
        seg,
        path=f"{prefix}/{seg.path}",
        rollup=moved(seg.rollup),
        coarse=moved(seg.coarse),
        daily=moved(seg.daily),
        metered=moved(seg.metered),
        jobs=moved(seg.jobs),
        gpus=moved(seg.gpus),
        unknown=tuple((key, _moved_unknown(text, prefix)) for key, text in seg.unknown),
    )


def _moved_unknown(text: str, prefix: str) -> str:
    """An entry of a level this code does not know, its path moved under `prefix` when it is
    shaped like a rollup's (the files `SegmentInfo.rollups` counts as the entry's)."""
    value = json.loads(text)
    if isinstance(value, dict):
        try:
            RollupInfo.from_dict(value)
        except TypeError:
            return text
        return json.dumps(dict(value, path=f"{prefix}/{value['path']}"), sort_keys=True)
    return text


def common_zone(zones: Mapping[str, str]) -> str | None:
    """The time zone every shard keeps its books in (by shard: its zone's name); a
    `SegmentError` naming two shards that differ. None: no shards."""
    first: tuple[str, str] | None = None
    for name in ordered(zones):
        if first is None:
            first = (name, zones[name])
        elif zones[name] != first[1]:
            raise SegmentError(
                f"the shards of this ledger keep their books in different time zones: shard "
                f"{first[0]} in {first[1]}, shard {name} in {zones[name]}; one ledger has one "
                "time zone (`ledger.timezone`)"
            )
    return None if first is None else first[1]


def side_source(names: Iterable[str]) -> str | None:
    """The shard the union's admin log, inventory and audit trail come from: the global shard,
    else the root ledger; None: neither (they are empty)."""
    present = set(names)
    for name in (GLOBAL_SHARD, ROOT_SHARD):
        if name in present:
            return name
    return None


def summed_refused(shards: Iterable[Sequence[RefusedGroup]]) -> list[RefusedGroup]:
    """The dead-letter summaries of every shard as one: per reason and topic the letters
    summed, the first and last recording times widened, the example the newest letter's (of
    the shard that recorded it last); ordered as a writer orders its own (most letters first,
    then reason, topic)."""
    merged: dict[tuple[str, str], RefusedGroup] = {}
    for groups in shards:
        for g in groups:
            key = (g.reason, g.topic)
            have = merged.get(key)
            if have is None:
                merged[key] = g
                continue
            newest = g if g.last_recorded_us > have.last_recorded_us else have
            merged[key] = RefusedGroup(
                g.reason,
                g.topic,
                have.letters + g.letters,
                min(have.first_recorded_us, g.first_recorded_us),
                max(have.last_recorded_us, g.last_recorded_us),
                newest.example,
            )
    return sorted(merged.values(), key=lambda g: (-g.letters, g.reason, g.topic))


def closed_in_union(records: Mapping[str, Iterable[str]]) -> list[str]:
    """The periods closed in the union: those every shard has its closed record of (by shard:
    the periods it has records of), oldest first. No shards: none."""
    periods: set[str] | None = None
    for closed in records.values():
        periods = set(closed) if periods is None else periods & set(closed)
    return sorted(periods or ())


def union_record(
    period: str, records: Mapping[str, ClosedPeriod], rows: int, sha256: str
) -> ClosedPeriod:
    """The union's record of a period every shard closed (`records`: each shard's): the close's
    event, time, actor and reason from the global shard's record (else the first shard's), and
    `rows` / `sha256` of the union's postings booked into it (`ledger.closing`)."""
    first = records[ordered(records)[0]]
    return ClosedPeriod(
        period, first.event_id, first.effective_us, first.actor, first.reason, rows, sha256
    )
