"""What the shards of a sharded ledger have sealed, as the `ShardsSealedThrough` its global
shard's owner publishes (`ledger.admin.sealed_events`; `docs/design/several-workers.md`,
"Cross-shard facts are events").

Pure, values in and value out:
- `newest_usage`: a shard's newest sealed usage time, from its manifest's segment summaries
  (the latest end of a usage interval a segment lists);
- `watermark`: the minimum of that over the samples shards (every shard but the global one and
  a root ledger, `ledger.store.union_rules`) that have sealed usage; None while none has;
- `unsealed_without_usage`: the shards with no sealed usage whose partition holds samples they
  have not sealed (given the partitions' end offsets): the watermark waits for those only;
- `usage_lines`: the consumer postings of usage and reversal transactions ending at or before
  the watermark, summed per (job, team, unit, period) in budget units;
- `shards_sealed_through`: the event, from the watermark and those lines: per job (only the
  `jobs` asked for, the holds the global shard has open: the event stays small) and per team.

The I/O here: `read_usage_lines`, the same sums by DuckDB over sealed postings (from the fine
rollups of the segments wholly below the watermark), and
`union_sealed_through`, the event of a union read cache (`ledger.store.union.pull_shards`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import duckdb

from ledger.accounts import AccountKind
from ledger.admin import JobUsage, ShardsSealedThrough, TeamUsage
from ledger.admin.events import BUDGET_UNITS, LEDGER_ACTOR
from ledger.postings import Transaction, TransactionKind
from ledger.store.layout import SEGMENTS_DIR, sql_list
from ledger.store.segments import Manifest, SegmentInfo
from ledger.store.union_rules import GLOBAL_SHARD, ROOT_SHARD, SHARDS_PREFIX
from ledger.units import Unit

_KINDS = (TransactionKind.USAGE.value, TransactionKind.REVERSAL.value)
_CONSUMER = f"{AccountKind.CONSUMER}:"


@dataclass(frozen=True, slots=True)
class UsageLine:
    """Consumer usage of one (job, team, unit, period); `job_id` None: usage of no job."""

    job_id: str | None
    team: str
    unit: Unit
    period: str
    amount: int


def _line_order(line: UsageLine) -> tuple[str, str, str, str]:
    return (line.job_id or "", line.team, line.unit.value, line.period)


def newest_usage(segments: Iterable[SegmentInfo]) -> int | None:
    """The latest usage end the segments' summaries list (None: no usage sealed)."""
    ends = [s.summary.usage_last_us for s in segments if s.summary is not None]
    known = [end for end in ends if end is not None]
    return max(known) if known else None


def samples_shards(union: Sequence[SegmentInfo]) -> dict[str, list[SegmentInfo]]:
    """A union manifest's entries (paths `shards/<name>/…`) per samples shard."""
    out: dict[str, list[SegmentInfo]] = {}
    for seg in union:
        top, name, *_ = (*seg.path.split("/", 2), "")
        if top == SHARDS_PREFIX and name not in (GLOBAL_SHARD, ROOT_SHARD):
            out.setdefault(name, []).append(seg)
    return out


def watermark(newest: Mapping[str, int | None]) -> int | None:
    """The minimum of the samples shards' newest sealed usage times, over the shards that have
    sealed usage; None when none has. A shard with none is not waited for here: every samples
    shard seals the admin and jobs events it folds for its views, so a partition no GPU writes
    to would hold the watermark (the holds' settlement, carry-over) back for ever. Whether one
    holds samples it has not sealed yet is `unsealed_without_usage`'s to say."""
    known = [t for t in newest.values() if t is not None]
    return min(known) if known else None


def sealed_next(segments: Iterable[SegmentInfo], topic: str, partition: int) -> int:
    """The next offset of `topic`'s `partition` after those the segments sealed (0: none)."""
    ends = [s.last_offset + 1 for s in segments if (s.topic, s.partition) == (topic, partition)]
    return max(ends, default=0)


def unsealed_without_usage(
    shards: Mapping[str, Sequence[SegmentInfo]], topic: str, ends: Mapping[int, int]
) -> list[str]:
    """The samples shards (of the partitions of `topic` whose end offsets `ends` gives) that
    have sealed no usage while their partition holds samples they have not sealed: their first
    samples may end before any watermark, so there is none until they seal (a shard with no
    head, or nothing sealed, counts from offset 0)."""
    waiting = []
    for partition, end in sorted(ends.items()):
        name = f"samples-{partition}"
        segments = shards.get(name, ())
        if newest_usage(segments) is None and end > sealed_next(segments, topic, partition):
            waiting.append(name)
    return waiting


def usage_lines(transactions: Iterable[Transaction], through_us: int) -> list[UsageLine]:
    """The consumer usage of `transactions` (usage and reversals) ending at or before
    `through_us`, summed per (job, team, unit, period)."""
    sums: dict[tuple[str | None, str, Unit, str], int] = {}
    for txn in transactions:
        if txn.kind.value not in _KINDS or txn.end_us > through_us:
            continue
        for p in txn.postings:
            if p.unit in BUDGET_UNITS and p.account.startswith(_CONSUMER):
                team = p.account[len(_CONSUMER) :].partition("/")[0]
                key = (p.job_id, team, p.unit, txn.period)
                sums[key] = sums.get(key, 0) + p.amount
    lines = [UsageLine(*key, amount) for key, amount in sums.items()]
    return sorted(lines, key=_line_order)


def read_usage_lines(
    root: Path, segments: Sequence[SegmentInfo], through_us: int
) -> list[UsageLine]:
    """`usage_lines` of the sealed postings `segments` (paths relative to `root`) list. A
    segment whose postings all end by `through_us` is read from its fine rollup (the same sums
    by period, kind, account, unit and job, a fraction of the rows); only the segments the
    watermark cuts through — the newest few — are read whole."""
    whole: list[Path] = []
    rolled: list[Path] = []
    for seg in segments:
        if seg.summary is None or not seg.rows:
            continue
        below = seg.max_end_us is not None and seg.max_end_us <= through_us
        if below and seg.rollup is not None:
            rolled.append(root / seg.rollup.path)
        else:
            whole.append(root / seg.path)
    if not whole and not rolled:
        return []
    columns = "job_id, account, unit, period, amount, kind, end_us"
    sources = [
        f"SELECT {columns} FROM read_parquet([{sql_list(files)}])"
        for files in (whole, rolled)
        if files
    ]
    units = ", ".join(f"'{u.value}'" for u in BUDGET_UNITS)
    kinds = ", ".join(f"'{k}'" for k in _KINDS)
    sql = f"""
        SELECT job_id, split_part(substr(account, {len(_CONSUMER) + 1}), '/', 1) AS team,
               unit, period, sum(amount)::BIGINT
        FROM ({" UNION ALL ".join(sources)})
        WHERE kind IN ({kinds}) AND unit IN ({units}) AND end_us <= ?
          AND starts_with(account, '{_CONSUMER}')
        GROUP BY ALL"""
    with duckdb.connect() as con:
        rows = con.execute(sql, [through_us]).fetchall()
    lines = [UsageLine(j, t, Unit(u), p, int(a)) for j, t, u, p, a in rows]
    return sorted(lines, key=_line_order)


def shards_sealed_through(
    through_us: int,
    shards: Iterable[str],
    lines: Iterable[UsageLine],
    jobs: Collection[str] | None = None,
    effective_us: int | None = None,
) -> ShardsSealedThrough:
    """The event: the watermark, the shards it was read from, and per job (of `jobs`; None:
    every job) and per team the usage `lines` sum to (zero sums left out); `covers`: the jobs
    asked for (None: every job), so a hold of a job not asked for is not settled from it. Its
    effective time is the watermark unless given, so the same facts make the same event
    (and id)."""
    per_job: dict[tuple[str, Unit], int] = {}
    per_team: dict[tuple[str, Unit, str], int] = {}
    for line in lines:
        if line.job_id is not None and (jobs is None or line.job_id in jobs):
            key = (line.job_id, line.unit)
            per_job[key] = per_job.get(key, 0) + line.amount
        team_key = (line.team, line.unit, line.period)
        per_team[team_key] = per_team.get(team_key, 0) + line.amount
    return ShardsSealedThrough(
        through_us=through_us,
        shards=tuple(sorted(shards)),
        jobs=tuple(JobUsage(j, u, a) for (j, u), a in sorted(per_job.items()) if a),
        teams=tuple(TeamUsage(t, u, p, a) for (t, u, p), a in sorted(per_team.items()) if a),
        actor=LEDGER_ACTOR,
        reason="every samples shard has sealed its usage through the watermark",
        effective_us=through_us if effective_us is None else effective_us,
        covers=None if jobs is None else tuple(sorted(set(jobs))),
    )


def union_sealed_through(
    cache: Path,
    jobs: Collection[str] | None = None,
    samples: tuple[str, Mapping[int, int]] | None = None,
) -> ShardsSealedThrough | None:
    """The `ShardsSealedThrough` of the union in the read cache `cache` (its manifest lists
    every shard's segments): the samples shards' watermark and their usage up to it (per job of
    `jobs`, None: every job); None while there is no watermark, or while a shard with no
    sealed usage has samples to seal (`samples`: the samples topic and its partitions' end
    offsets; None: not known, not checked)."""
    shards = samples_shards(Manifest(cache / SEGMENTS_DIR).load())
    if samples is not None and unsealed_without_usage(shards, *samples):
        return None
    through = watermark({name: newest_usage(segs) for name, segs in shards.items()})
    if through is None:
        return None
    entries = [seg for segs in shards.values() for seg in segs]
    lines = read_usage_lines(cache / SEGMENTS_DIR, entries, through)
    return shards_sealed_through(through, shards, lines, jobs)
