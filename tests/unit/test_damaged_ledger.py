"""A damaged sealed ledger, against real Parquet files and manifests: each kind of damage ×
`verify` and × every reader. `verify` names the file and the damage and fails; every reader
(queries, reports, rollups, balances, the writer's store, the raw-event archive, the CLI)
refuses with a `SegmentError` naming them rather than return totals without the damaged file;
a stray file no manifest lists is noted by `verify` and ignored by readers."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pytest
from click.testing import CliRunner

from ledger.errors import SegmentError, StoreError
from ledger.read import rollups
from ledger.read.balances import sealed_balances
from ledger.read.job_history import read_job_event_log
from ledger.read.queries import LedgerQueries
from ledger.read.reports import ReportQueries, cost_report
from ledger.store.hot import DuckDBStore
from ledger.store.layout import ARCHIVE_DIR, SEGMENTS_DIR
from ledger.store.rebuild import archive_batches
from ledger.store.segments import Manifest
from ledger.store.verify import verify_ledger
from tally.cli import cli
from tests.unit.test_store import TOPIC, ingest, message


@pytest.fixture(scope="module")
def sealed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A sound sealed ledger: three postings segments over two partitions, and their archive."""
    data_dir = tmp_path_factory.mktemp("sealed") / "ledger"
    with DuckDBStore(data_dir) as store:
        ingest(store, message(0, 1, 2), message(1, 3), message(0, 4, partition=1, gpu="GPU-2"))
        store.seal()
        ingest(store, message(2, 5, 6))
        store.seal()
    return data_dir


@pytest.fixture
def ledger(sealed: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "ledger"
    shutil.copytree(sealed, copy, symlinks=True)
    return copy


# ------------------------------------------------------------------------------ damage


def _first(data_dir: Path, root: str) -> Path:
    return data_dir / root / Manifest(data_dir / root).load()[0].path


def _bad_magic(path: Path) -> None:
    path.write_bytes(b"XXXX" + path.read_bytes()[4:])


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _rewrite_valid(path: Path) -> None:
    """Valid Parquet with every amount (a gpus rollup's every capacity GPU-ms) doubled (still
    zero-sum): wrong totals if read."""
    tmp = path.with_name("rewritten.tmp")
    con = duckdb.connect()
    described = con.execute(f"DESCRIBE SELECT * FROM read_parquet('{path}')").fetchall()
    columns = [c[0] for c in described]
    column = "amount" if "amount" in columns else "capacity_gpu_ms"
    con.execute(
        f"COPY (SELECT * REPLACE ({column} * 2 AS {column}) FROM read_parquet('{path}')) "
        f"TO '{tmp}' (FORMAT parquet)"
    )
    con.close()
    tmp.replace(path)


def _garble(path: Path) -> None:
    raw = path.read_bytes()
    path.write_bytes(raw[:40] + b"\x00" + raw[41:])


@dataclass(frozen=True)
class Damage:
    root: str  # "segments" or "archive": whose files it damages
    harm: Callable[[Path], None]  # applied to the file
    manifest: bool  # True: harms the manifest, else the first listed segment
    says: str  # the phrase naming the damage
    rollup: str | None = None  # a rollup level's name: harms the first listed segment's one

    def apply(self, data_dir: Path) -> Path:
        """Damage `data_dir`; the path of the damaged file."""
        if self.rollup is not None:
            first = Manifest(data_dir / self.root).load()[0]
            rollup = first.rollup_of(self.rollup)
            assert rollup is not None
            path = data_dir / self.root / rollup.path
        elif self.manifest:
            path = Manifest(data_dir / self.root).path
        else:
            path = _first(data_dir, self.root)
        self.harm(path)
        return path


SEGMENT_DAMAGE = {
    "bad-magic": Damage(
        SEGMENTS_DIR, _bad_magic, False, "not a Parquet file (bad magic at the start)"
    ),
    "truncated-segment": Damage(
        SEGMENTS_DIR, _truncate, False, "not a Parquet file (bad magic at the end: truncated"
    ),
    "altered-still-valid-parquet": Damage(
        SEGMENTS_DIR,
        _rewrite_valid,
        False,
        "checksum does not match the manifest: a valid Parquet file whose bytes changed",
    ),
    "missing-segment": Damage(
        SEGMENTS_DIR, lambda p: p.unlink(), False, "listed in the manifest but missing"
    ),
    "truncated-manifest": Damage(SEGMENTS_DIR, _truncate, True, "unreadable manifest: truncated"),
    "garbled-manifest": Damage(
        SEGMENTS_DIR, _garble, True, "unreadable manifest: not valid JSON at byte 40"
    ),
}
ROLLUP_DAMAGE = {
    "rollup-altered-still-valid-parquet": Damage(
        SEGMENTS_DIR,
        _rewrite_valid,
        False,
        "checksum does not match the manifest: a valid Parquet file whose bytes changed",
        rollup="rollup",
    ),
    "rollup-missing": Damage(
        SEGMENTS_DIR, lambda p: p.unlink(), False, "listed in the manifest but missing", "rollup"
    ),
}


def _level_damage(level: str) -> dict[str, Damage]:
    """A rollup level's file of the first segment altered (still valid Parquet) or missing."""
    return {
        f"{level}-altered-still-valid-parquet": Damage(
            SEGMENTS_DIR,
            _rewrite_valid,
            False,
            "checksum does not match the manifest: a valid Parquet file whose bytes changed",
            rollup=level,
        ),
        f"{level}-missing": Damage(
            SEGMENTS_DIR, lambda p: p.unlink(), False, "listed in the manifest but missing", level
        ),
    }


COARSE_DAMAGE = _level_damage("coarse")
DAILY_DAMAGE = _level_damage("daily")
GPUS_DAMAGE = _level_damage("gpus")
ARCHIVE_DAMAGE = {
    "archive-bad-magic": Damage(
        ARCHIVE_DIR, _bad_magic, False, "not a Parquet file (bad magic at the start)"
    ),
    "archive-missing-segment": Damage(
        ARCHIVE_DIR, lambda p: p.unlink(), False, "listed in the manifest but missing"
    ),
    "archive-truncated-manifest": Damage(
        ARCHIVE_DIR, _truncate, True, "unreadable manifest: truncated"
    ),
}


def _named(path: Path, data_dir: Path, damage: Damage) -> str:
    """How `verify` names the damaged file."""
    name = str(path) if damage.manifest else str(path.relative_to(data_dir / damage.root))
    if damage.root == ARCHIVE_DIR:
        return f"archive: {name}"
    return name if damage.manifest else f"segments/{name}"


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(d, id=name)
        for name, d in (SEGMENT_DAMAGE | ROLLUP_DAMAGE | ARCHIVE_DAMAGE).items()
    ]
    + [pytest.param(COARSE_DAMAGE["coarse-altered-still-valid-parquet"], id="coarse-altered")],
)
def test_verify_names_the_file_and_the_damage(ledger, damage):
    path = damage.apply(ledger)
    report = verify_ledger(ledger)
    assert not report.ok
    expected = f"{_named(path, ledger, damage)}: "
    assert any(p.startswith(expected) and damage.says in p for p in report.problems), (
        expected,
        report.problems,
    )
    result = CliRunner().invoke(cli, ["ledger", "verify", "--data-dir", str(ledger)])
    assert result.exit_code == 1, result.output
    assert damage.says in result.output


# ------------------------------------------------------------------------------ readers


def _with_queries(read: Callable[[ReportQueries], Any]) -> Callable[[Path], Any]:
    def run(data_dir: Path) -> Any:
        q = ReportQueries(data_dir)
        try:
            return read(q)
        finally:
            q.close()

    return run


def _writer_balances(data_dir: Path) -> Any:
    with DuckDBStore(data_dir) as store:
        return store.folded_balances()


def _cli_report(data_dir: Path) -> str:
    result = CliRunner().invoke(
        cli, ["report", "cost", "--by", "team", "--data-dir", str(data_dir), "-o", "csv"]
    )
    if result.exit_code == 4:
        raise SegmentError(result.output)  # `error: <the SegmentError's message>`, exit 4
    assert result.exit_code == 0, result.output
    return result.output


POSTINGS_READERS: dict[str, Callable[[Path], Any]] = {
    "queries-totals": _with_queries(lambda q: q.totals_by_unit()),
    "queries-transaction": _with_queries(lambda q: q.transaction_count()),
    "report-cost": _with_queries(lambda q: cost_report(q, ("team",))),
    "rollup-cost-table": _with_queries(lambda q: rollups.cost_table(q, "team", rollups.Filters())),
    "rollup-extent": _with_queries(rollups.extent),
    "sealed-balances": sealed_balances,
    "writer-store": _writer_balances,
    "cli-report-cost": _cli_report,
}
# the readers that read the segments' rollups (`ledger.store.rollup_files`): by user, the
# fine ones; by team with no hours, the daily ones; the hours of a day by team, the coarse ones
ROLLUP_READERS: dict[str, Callable[[Path], Any]] = {
    "report-cost-by-user": _with_queries(lambda q: cost_report(q, ("user",))),
}
DAILY_READERS = {
    name: POSTINGS_READERS[name] for name in ("report-cost", "rollup-cost-table", "cli-report-cost")
}
COARSE_READERS: dict[str, Callable[[Path], Any]] = {
    "rollup-cost-over-time-hourly": _with_queries(
        lambda q: rollups.cost_over_time(q, "team", rollups.HOUR_US, rollups.Filters())
    ),
}
# each GPU's hours: the Platform page's nodes and heatmap (all time: every segment's)
GPUS_READERS: dict[str, Callable[[Path], Any]] = {
    "platform-nodes-last-seen": _with_queries(rollups.nodes_last_seen),
    "platform-heatmap": _with_queries(
        lambda q: rollups.utilisation_heatmap(q, 0, 2**62, rollups.HOUR_US)
    ),
}
ARCHIVE_READERS: dict[str, Callable[[Path], Any]] = {
    "rebuild-archive-batches": lambda d: list(archive_batches(d)),
    "job-history": lambda d: read_job_event_log(d, TOPIC),
}


def _cases(damages: dict[str, Damage], readers: dict[str, Callable[[Path], Any]]) -> list[Any]:
    return [
        pytest.param(damage, read, id=f"{damage_name}-x-{reader_name}")
        for damage_name, damage in damages.items()
        for reader_name, read in readers.items()
    ]


@pytest.mark.parametrize(
    ("damage", "read"),
    _cases(SEGMENT_DAMAGE, POSTINGS_READERS)
    + _cases(ROLLUP_DAMAGE, ROLLUP_READERS)
    + _cases(COARSE_DAMAGE, COARSE_READERS)
    + _cases(DAILY_DAMAGE, DAILY_READERS)
    + _cases(GPUS_DAMAGE, GPUS_READERS)
    + _cases(ARCHIVE_DAMAGE, ARCHIVE_READERS),
)
def test_readers_refuse_a_damaged_ledger(ledger, damage, read):
    read(ledger)  # sound: it reads (and remembers the files as intact)
    path = damage.apply(ledger)
    with pytest.raises(SegmentError) as refused:
        read(ledger)
    assert isinstance(refused.value, StoreError)
    message = str(refused.value)
    assert str(path) in message and damage.says in message, message


@pytest.mark.parametrize(
    "read",
    [pytest.param(r, id=name) for name, r in (POSTINGS_READERS | ARCHIVE_READERS).items()],
)
def test_a_stray_file_is_noted_by_verify_and_ignored_by_readers(ledger, read):
    sound = read(ledger)
    for root in (SEGMENTS_DIR, ARCHIVE_DIR):
        original = _first(ledger, root)
        stray = original.with_name("00000000000000000007-00000000000000000009.parquet")
        shutil.copyfile(original, stray)
    assert read(ledger) == sound
    report = verify_ledger(ledger)
    assert report.ok, report.problems
    assert sorted(n.split(":")[0] for n in report.notes) == sorted(
        f"{root}/{_first(ledger, root).parent.relative_to(ledger / root)}/"
        "00000000000000000007-00000000000000000009.parquet"
        for root in (SEGMENTS_DIR, ARCHIVE_DIR)
    )
    assert all("stray file, not in the manifest" in n for n in report.notes)


def test_a_reader_checks_a_segment_once_per_process(ledger, monkeypatch):
    """The checksum is not recomputed on every query: once per file version per process."""
    from ledger.store import integrity

    hashed: list[Path] = []
    real = integrity.file_sha256

    def counting(path: Path) -> str:
        hashed.append(path)
        return real(path)

    monkeypatch.setattr(integrity, "file_sha256", counting)
    q = LedgerQueries(ledger)
    try:
        first = q.totals_by_unit()
        listed = len(q.segments())
        assert len(hashed) == listed
        assert q.totals_by_unit() == first and q.transaction_count() > 0
        assert len(hashed) == listed  # not hashed again
        _rewrite_valid(_first(ledger, SEGMENTS_DIR))  # a new file version is checked again
        with pytest.raises(SegmentError, match="bytes changed since it was sealed"):
            q.totals_by_unit()
    finally:
        q.close()


@pytest.mark.parametrize("damage", [pytest.param(d, id=name) for name, d in SEGMENT_DAMAGE.items()])
def test_metrics_say_the_ledger_is_unreadable_and_still_serve_the_rest(ledger, damage):
    from tally.metrics import TallyMetrics

    def scrape() -> dict[str, float]:
        metrics = TallyMetrics(ledger, sections=("worker",))
        metrics.seal_failed()
        return {s.name: s.value for m in metrics.registry.collect() for s in m.samples}

    sound = scrape()
    assert sound["tally_ledger_readable"] == 1 and sound["tally_ledger_segments"] == 3
    damage.apply(ledger)
    damaged = scrape()
    assert damaged["tally_ledger_readable"] == 0
    assert "tally_ledger_segments" not in damaged
    assert damaged["tally_worker_seal_failures_total"] == 1
