"""Rebuilding a sharded ledger: each shard of a union replayed from its own archive with the
role its writer folded with, and compared with what that shard sealed.

Each shard numbers its own archive batches, so a union's archive is no one ledger's to replay
(`ledger.store.rebuild` refuses it); its shards are. A shard's role is its directory's name
(`role_of`: `…/shards/global` the global shard, `…/shards/samples-<p>` a samples shard, any
other directory a whole ledger), in a worker's data directory and in a reader's cache alike. The
union is exact when every shard is: the union adds nothing to its shards but their sum.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from ledger.ingest.shards import ShardRole, ShardRoleError
from ledger.store.rebuild import (
    ArchivedBatch,
    Difference,
    DifferenceKind,
    Progress,
    RebuildReport,
    ReplaySettings,
    archive_batches,
    rebuild,
)
from ledger.store.union import is_union, shard_dir, union_shards
from ledger.store.union_rules import GLOBAL_SHARD, SHARDS_PREFIX


def role_of(data_dir: Path) -> ShardRole:
    """The role the writer of `data_dir` folded with: a shard's (`…/shards/global`,
    `…/shards/samples-<p>`: a worker's shard, or a shard in a reader's cache), else `WHOLE`;
    what `tally ledger rebuild` replays a shard with."""
    if data_dir.parent.name != SHARDS_PREFIX:
        return ShardRole.WHOLE
    if data_dir.name == GLOBAL_SHARD:
        return ShardRole.GLOBAL
    prefix, _, partition = data_dir.name.partition("-")
    is_samples = prefix == "samples" and partition.isdigit()
    return ShardRole.SAMPLES if is_samples else ShardRole.WHOLE


@dataclass(frozen=True, slots=True)
class Member:
    """One ledger a rebuild replays: `shard` ("" for a ledger that is no union's), its live
    directory and the directory it is rebuilt into."""

    shard: str
    live: Path
    into: Path


def members(live: Path, into: Path) -> tuple[Member, ...]:
    """What a rebuild of `live` replays: `live` itself, or each shard of the union `live`
    holds, in the union's order, each into its own directory under `into`."""
    if not is_union(live):
        return (Member("", live, into),)
    return tuple(
        Member(name, shard_dir(live, name), into / SHARDS_PREFIX / name)
        for name in union_shards(live)
    )


Source = Callable[["Member"], tuple[Iterable[ArchivedBatch], Sequence[Difference]]]


def rebuild_members(
    live: Path,
    into: Path,
    settings: Callable[[Path], ReplaySettings],
    source: Source | None = None,
    progress: Progress | None = None,
) -> Iterator[tuple[Member, RebuildReport]]:
    """Rebuild each member of `live` (see `members`) with `settings(its live directory)`, its
    role set from its directory; a shard whose archive holds what that role never folds (its
    writer was no such shard) is one `replay` difference. `source` gives a member's batches and
    the differences reading them finds (default: its sealed archive, none)."""
    for member in members(live, into):
        role = role_of(member.live)
        replay = replace(settings(member.live), role=role)
        batches, found = (archive_batches(member.live), ()) if source is None else source(member)
        try:
            yield member, rebuild(member.live, member.into, replay, batches, progress, found)
        except ShardRoleError as exc:  # its archive holds what its role never folds
            refused = Difference(
                DifferenceKind.REPLAY,
                "archive",
                note=f"not replayable as a {role} shard: {exc}",
            )
            yield member, RebuildReport(member.into, 0, 0, (refused,))


def named_report(reports: list[tuple[Member, RebuildReport]], into: Path) -> RebuildReport:
    """The members' reports as one: batches and messages summed, each difference's subject
    prefixed with its shard's name (`<shard>: <subject>`) where there are shards."""
    return RebuildReport(
        into,
        sum(r.batches for _m, r in reports),
        sum(r.messages for _m, r in reports),
        tuple(
            replace(d, subject=f"{m.shard}: {d.subject}" if m.shard else d.subject)
            for m, r in reports
            for d in r.differences
        ),
    )
