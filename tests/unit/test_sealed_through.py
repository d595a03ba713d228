"""The shards' watermark as an event (`ledger.admin.sealed_events`) and computed from shards
(`ledger.store.sealed_usage`): the codec refuses malformed usage lines; the watermark is the
minimum of the samples shards' newest sealed usage, and unknown while one has none; the usage
lines sum consumer usage and reversals up to the watermark per job and team, the same from
transactions in memory and from their sealed Parquet read by DuckDB."""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import duckdb
import orjson
import pyarrow.parquet as pq
import pytest

from ledger.admin import (
    JobUsage,
    ShardsSealedThrough,
    TeamUsage,
    admin_envelope,
    admin_envelope_to_dict,
    decode_admin_message,
)
from ledger.postings import Posting, Transaction, TransactionKind
from ledger.store.port import SourcedTransaction
from ledger.store.rollup_files import RollupInfo, write_rollup
from ledger.store.schema import transactions_to_arrow
from ledger.store.sealed_usage import (
    UsageLine,
    newest_usage,
    read_usage_lines,
    samples_shards,
    shards_sealed_through,
    unsealed_without_usage,
    usage_lines,
    watermark,
)
from ledger.store.segments import SegmentInfo, SegmentSummary
from ledger.units import Unit
from tests.builders import T0_US

SEALED = ShardsSealedThrough(
    T0_US,
    ("samples-0",),
    (JobUsage("job-1", Unit.MONEY, 9),),
    (TeamUsage("vision", Unit.MONEY, "2026-11", 9),),
    "tally-ledger",
    "sealed",
    T0_US,
)


def _with_data(**changes: Any) -> bytes:
    message = admin_envelope_to_dict(admin_envelope(SEALED))
    message["data"] = {**message["data"], **changes}
    return orjson.dumps(message)


MALFORMED = {
    "a-float-amount": ({"jobs": [["job-1", "money_micros", 9.0]]}, "expected an integer"),
    "energy-is-no-budget-unit": ({"jobs": [["job-1", "energy_mj", 9]]}, "a usage line is in"),
    "a-job-named-twice": (
        {"jobs": [["job-1", "money_micros", 1], ["job-1", "money_micros", 2]]},
        "named twice",
    ),
    "a-short-line": ({"teams": [["vision", "money_micros", 9]]}, "an array of 4 items"),
    "no-month": ({"teams": [["vision", "money_micros", "2026-13", 9]]}, "2026-13"),
    "a-covered-job-named-twice": ({"covers": ["job-1", "job-1"]}, "named twice"),
    "covers-not-an-array": ({"covers": "job-1"}, "an array of at most"),
}


@pytest.mark.parametrize(("data", "reason"), MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_usage_line_is_a_dead_letter(data: dict[str, Any], reason: str) -> None:
    assert decode_admin_message(_with_data())[0][0].data == SEALED  # the unchanged one decodes
    envelopes, dead = decode_admin_message(_with_data(**data))
    assert envelopes == []
    assert len(dead) == 1 and reason in dead[0].reason, dead


COVERS = {"absent-is-every-job": None, "none": (), "some": ("job-1", "job-2")}


@pytest.mark.parametrize("covers", COVERS.values(), ids=COVERS.keys())
def test_the_jobs_an_event_covers_travel_and_absent_encodes_as_before(
    covers: tuple[str, ...] | None,
) -> None:
    event = replace(SEALED, covers=covers)
    message = admin_envelope_to_dict(admin_envelope(event))
    assert ("covers" in message["data"]) is (covers is not None)
    (decoded,), _ = decode_admin_message(orjson.dumps(message))
    assert decoded.data == event
    assert decoded.data.covered() == (None if covers is None else frozenset(covers))
    if covers is None:  # the same id as an event from before the field
        assert admin_envelope(event).id == admin_envelope(SEALED).id


WATERMARKS = {
    "no-shard": ({}, None),
    "a-shard-without-usage-is-not-waited-for": ({"samples-0": 50, "samples-1": None}, 50),
    "no-shard-with-usage": ({"samples-0": None, "samples-1": None}, None),
    "the-slowest-shard": ({"samples-0": 50, "samples-1": 30, "samples-2": 70}, 30),
}


@pytest.mark.parametrize(("newest", "expected"), WATERMARKS.values(), ids=WATERMARKS.keys())
def test_the_watermark_is_the_slowest_samples_shard(
    newest: dict[str, int | None], expected: int | None
) -> None:
    assert watermark(newest) == expected


def _segment(path: str, rows: int, last: int | None) -> SegmentInfo:
    summary = SegmentSummary(usage_first_us=None if last is None else 0, usage_last_us=last)
    return SegmentInfo(path, "c", "samples", 0, 0, 9, rows, "-", 0, last, summary)


def test_a_union_is_split_into_its_samples_shards_and_their_newest_usage() -> None:
    union = [
        _segment("shards/global/a.parquet", 4, None),
        _segment("shards/_root/b.parquet", 4, 99),
        _segment("shards/samples-0/c.parquet", 4, 20),
        _segment("shards/samples-0/d.parquet", 4, 40),
        _segment("shards/samples-1/e.parquet", 4, None),
    ]
    shards = samples_shards(union)
    assert sorted(shards) == ["samples-0", "samples-1"]
    assert {name: newest_usage(segs) for name, segs in shards.items()} == {
        "samples-0": 40,
        "samples-1": None,
    }


THROUGH = T0_US + 100


def _usage(txn_id: str, end: int, job: str | None, amount: int, kind: str = "usage") -> Transaction:
    team_account = "consumer:vision/detection"
    postings = (
        Posting(team_account, Unit.MONEY, amount, "vision", "detection", "ada", job),
        Posting(team_account, Unit.GPU_MS, amount * 10, "vision", "detection", "ada", job),
        Posting(team_account, Unit.ENERGY_MJ, 7, "vision", "detection", "ada", job),
        Posting("capacity:h100/H100", Unit.MONEY, -amount),
        Posting("capacity:h100/H100", Unit.GPU_MS, -amount * 10),
        Posting("capacity:h100/H100", Unit.ENERGY_MJ, -7),
    )
    return Transaction(
        txn_id,
        TransactionKind(kind),
        end - 10,
        end,
        "GPU-1",
        "H100",
        "h100",
        "n",
        postings,
        (txn_id,),
        "2026-11",
    )


TRANSACTIONS = [
    _usage("u1", T0_US + 50, "job-1", 300),
    _usage("u2", THROUGH, "job-1", 200),  # ends at the watermark: in
    _usage("u3", THROUGH + 1, "job-1", 1_000),  # after it: out
    _usage("u4", T0_US + 60, "job-2", 40),
    _usage("r1", T0_US + 50, "job-1", -300, "reversal"),  # reverses u1
    _usage("u5", T0_US + 70, None, 5),  # a team's usage of no job
]


def test_the_event_sums_usage_up_to_the_watermark_per_job_asked_for_and_per_team() -> None:
    lines = usage_lines(TRANSACTIONS, THROUGH)
    event = shards_sealed_through(THROUGH, ["samples-1", "samples-0"], lines, jobs={"job-1"})
    assert event.through_us == event.effective_us == THROUGH
    assert event.shards == ("samples-0", "samples-1")
    assert event.covers == ("job-1",)  # asked for, with or without usage
    assert event.jobs == (JobUsage("job-1", Unit.GPU_MS, 2_000), JobUsage("job-1", Unit.MONEY, 200))
    assert event.teams == (
        TeamUsage("vision", Unit.GPU_MS, "2026-11", 2_450),
        TeamUsage("vision", Unit.MONEY, "2026-11", 245),
    )
    # the same facts make the same event, and so the same id
    again = shards_sealed_through(THROUGH, ["samples-0", "samples-1"], reversed(lines), {"job-1"})
    assert admin_envelope(again).id == admin_envelope(event).id


READS = {
    # the watermark cuts through the segment: read whole
    "cut-through": ([TRANSACTIONS], THROUGH),
    # every posting ends by the watermark: read from its fine rollup
    "wholly-below-from-the-rollup": ([TRANSACTIONS], THROUGH + 1),
    # one segment of each
    "both": ([TRANSACTIONS[:3], TRANSACTIONS[3:]], THROUGH),
}


@pytest.mark.parametrize(("parts", "through"), READS.values(), ids=READS.keys())
def test_sealed_parquet_reads_as_the_transactions_do(
    parts: list[list[Transaction]], through: int
) -> None:
    with tempfile.TemporaryDirectory() as name:
        root = Path(name)
        segments = []
        for n, part in enumerate(parts):
            sourced = [SourcedTransaction(t, "samples", 0, i) for i, t in enumerate(part)]
            pq.write_table(transactions_to_arrow(sourced, "c"), root / f"{n}.parquet")
            with duckdb.connect() as con:  # as the seal writes it beside the segment
                write_rollup(con, root / f"{n}.parquet", root / f"{n}.rollup.parquet")
            extent = max(t.end_us for t in part)
            segment = replace(
                _segment(f"{n}.parquet", len(part) * 6, extent),
                rollup=RollupInfo(f"{n}.rollup.parquet", 1, "-"),
            )
            segments.append(segment)
            if extent <= through:
                (root / segment.path).unlink()  # read from its rollup, never itself
        read = read_usage_lines(root, segments, through)
    assert read == usage_lines(TRANSACTIONS, through)
    assert UsageLine("job-2", "vision", Unit.MONEY, "2026-11", 40) in read


def _sealed(path: str, topic: str, last_offset: int, usage: int | None) -> SegmentInfo:
    summary = SegmentSummary(usage_first_us=None if usage is None else 0, usage_last_us=usage)
    return SegmentInfo(path, "c", topic, 1, 0, last_offset, 1, "-", 0, usage, summary)


WAITING = {
    "sealed-usage": ([_sealed("shards/samples-1/a", "samples", 9, 40)], 99, []),
    "no-samples-at-all": ([_sealed("shards/samples-1/j", "jobs", 4, None)], 0, []),
    "every-sample-sealed-none-used": ([_sealed("shards/samples-1/s", "samples", 9, None)], 10, []),
    "samples-not-sealed-yet": ([_sealed("shards/samples-1/j", "jobs", 4, None)], 3, ["samples-1"]),
    "more-than-sealed": ([_sealed("shards/samples-1/s", "samples", 9, None)], 12, ["samples-1"]),
    "no-head-yet": ([], 5, ["samples-1"]),
}


@pytest.mark.parametrize(("union", "end", "waiting"), WAITING.values(), ids=WAITING.keys())
def test_a_shard_without_usage_is_waited_for_only_while_it_has_samples_to_seal(
    union: list[SegmentInfo], end: int, waiting: list[str]
) -> None:
    shards = samples_shards(union)
    assert unsealed_without_usage(shards, "samples", {1: end}) == waiting
