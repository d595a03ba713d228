"""Segment summaries: each sealed postings segment's manifest entry says which periods, teams,
pools and models it holds and the span of its usage, so the pages' filters need no scan; the
summaries equal a scan of the postings, older manifests without them read the same, and
`verify` notices a summary that lies."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ledger.events import encode_batch
from ledger.ingest import ConsumedMessage, Ingestor
from ledger.pricing import Price, PriceBook
from ledger.read import rollups
from ledger.read.reports import ReportQueries
from ledger.store.hot import DuckDBStore
from ledger.store.layout import SEGMENTS_DIR
from ledger.store.segments import MANIFEST_NAME, Manifest
from ledger.store.verify import verify_ledger
from tests.builders import INTERVAL_US, T0_US, a_process, an_envelope, an_owner

# the extent as one scan of every posting computes it: what the summaries must reproduce
SCAN_SQL = (
    "SELECT list(DISTINCT period ORDER BY period DESC), "
    "list(DISTINCT team ORDER BY team) FILTER (account LIKE 'consumer:%' AND team IS NOT NULL), "
    "list(DISTINCT pool ORDER BY pool) FILTER (kind = 'usage' AND coalesce(pool, '') <> ''), "
    "list(DISTINCT model ORDER BY model) FILTER (kind = 'usage' AND coalesce(model, '') <> ''), "
    "min(start_us) FILTER (kind = 'usage'), max(end_us) FILTER (kind = 'usage') FROM {postings}"
)


MONTH_US = 30 * 86_400 * 1_000_000
SAMPLES = (  # (partition, end time, pool, model, team or None: unallocated)
    (0, T0_US - 5 * INTERVAL_US, "h100", "NVIDIA H100 80GB HBM3", "vision"),  # October
    (0, T0_US + INTERVAL_US, "h100", "NVIDIA H100 80GB HBM3", None),
    (1, T0_US + 2 * INTERVAL_US, "a100", "NVIDIA A100-SXM4-80GB", "search"),
    (1, T0_US + MONTH_US + INTERVAL_US, "l4", "NVIDIA L4", "language"),  # December
)


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ledger of four samples in three months on two partitions, sealed in two rounds."""
    data_dir = tmp_path_factory.mktemp("summaries") / "ledger"
    with DuckDBStore(data_dir) as store:
        ingestor = Ingestor(store, "c", PriceBook((Price("*", 3_600_000),)), {})
        for offset, (partition, end, pool, model, team) in enumerate(SAMPLES):
            owner = None if team is None else an_owner(team, "p")
            sample = an_envelope(
                sample_time_us=end, pool=pool, model=model, processes=(a_process(owner=owner),)
            )
            ingestor.apply([ConsumedMessage("s", partition, offset, encode_batch([sample]))])
            if offset % 2:
                store.seal()
    return data_dir


def _scanned(data_dir: Path) -> rollups.Extent:
    q = ReportQueries(data_dir)
    try:
        periods, teams, pools, models, first, last = q.rows(SCAN_SQL)[0]
    finally:
        q.close()
    return rollups.Extent(
        tuple(periods), tuple(teams), tuple(pools), tuple(models), int(first), int(last)
    )


def _extent(data_dir: Path) -> rollups.Extent:
    q = ReportQueries(data_dir)
    try:
        return rollups.extent(q)
    finally:
        q.close()


def _rewrite_manifest(data_dir: Path, change) -> None:
    path = data_dir / SEGMENTS_DIR / MANIFEST_NAME
    doc = json.loads(path.read_text())
    for entry in doc["segments"]:
        change(entry)
    path.write_text(json.dumps(doc))


def test_every_sealed_segment_carries_its_summary_and_the_extent_equals_a_scan(seeded):
    segments = Manifest(seeded / SEGMENTS_DIR).load()
    assert len(segments) > 1
    assert all(s.summary is not None for s in segments)
    found = _extent(seeded)
    assert found == _scanned(seeded)
    assert found.periods == ("2026-12", "2026-11", "2026-10")
    assert found.teams == ("language", "search", "vision")
    assert found.pools == ("a100", "h100", "l4")


def test_a_manifest_written_before_summaries_reads_the_same(seeded, tmp_path):
    older = tmp_path / "ledger"
    shutil.copytree(seeded, older)
    _rewrite_manifest(older, lambda entry: entry.pop("summary"))
    assert all(s.summary is None for s in Manifest(older / SEGMENTS_DIR).load())
    assert _extent(older) == _extent(seeded)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        pytest.param("teams", ["mallory"], id="a-team-it-does-not-hold"),
        pytest.param("usage_last_us", 1, id="a-wrong-time-span"),
    ],
)
def test_verify_reports_a_summary_that_does_not_match_its_segment(seeded, tmp_path, field, value):
    copy = tmp_path / "ledger"
    shutil.copytree(seeded, copy)
    assert verify_ledger(copy).ok
    _rewrite_manifest(copy, lambda entry: entry["summary"].__setitem__(field, value))
    report = verify_ledger(copy)
    assert not report.ok
    assert any("summary does not match" in p for p in report.problems)


def test_a_malformed_summary_is_an_unreadable_manifest(seeded, tmp_path):
    copy = tmp_path / "ledger"
    shutil.copytree(seeded, copy)
    _rewrite_manifest(copy, lambda entry: entry.__setitem__("summary", {"teams": [1]}))
    with pytest.raises(Exception, match="unreadable manifest"):
        Manifest(copy / SEGMENTS_DIR).load()
