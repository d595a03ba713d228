"""Sealing onto a volume that is really full (a size-capped tmpfs, `tests.capped_volume`: the
kernel refuses the write with ENOSPC): the seal fails with a `SealError` naming the file and
the reason, nothing half-written is visible, the committed rows stay in the hot tables, ingest
goes on, and the next seal once space returns seals everything exactly. The worker reports it
once in its log and in its metrics and keeps going."""

from __future__ import annotations

import asyncio
import errno
import logging
from pathlib import Path

import pytest

from ledger.errors import SealError
from ledger.read.queries import LedgerQueries
from ledger.store.hot import DuckDBStore
from ledger.store.segments import atomic_write_bytes
from ledger.store.verify import verify_ledger
from streams.worker import LedgerWorker, WorkerSettings
from tally.metrics import TallyMetrics
from tests.capped_volume import CappedVolume, capped_volume, put_on
from tests.unit.test_store import PRICES, ingest, message

VOLUME_BYTES = 1 << 20
BIG = tuple(range(10, 1600))  # one message whose segment is far larger than what is left


@pytest.fixture
def volume(tmp_path: Path):
    with capped_volume(tmp_path / "volume", VOLUME_BYTES) as v:
        yield v


def totals(data_dir: Path) -> tuple[int, dict[str, int]]:
    q = LedgerQueries(data_dir)
    try:
        return q.transaction_count(), q.totals_by_unit()
    finally:
        q.close()


def leftovers(volume: CappedVolume) -> list[Path]:
    return sorted(volume.path.rglob(".*.tmp-*"))


@pytest.mark.parametrize(
    ("on_volume", "leave_bytes"),
    [
        pytest.param(("segments", "archive"), 0, id="both-roots-full"),
        pytest.param(("segments",), 0, id="segments-full"),
        pytest.param(("archive",), 0, id="archive-full-after-the-postings-file"),
        pytest.param(("segments", "archive"), 24_576, id="fills-up-mid-file"),
    ],
)
def test_a_seal_on_a_full_volume_loses_nothing_and_resumes_when_space_returns(
    tmp_path, volume, on_volume, leave_bytes
):
    data_dir = tmp_path / "ledger"
    put_on(volume, data_dir, *on_volume)
    with DuckDBStore(data_dir) as store:
        ingest(store, message(0, 1, 2), message(1, 3))
        store.seal()
        before = totals(data_dir)
        manifest = store.manifest.path.read_bytes()
        ingest(store, message(2, *BIG))
        waiting = store.hot_rows()
        volume.fill(leave_bytes)

        with pytest.raises(SealError) as failed:
            store.seal()
        assert failed.value.reason == "No space left on device"
        assert failed.value.path.startswith(str(data_dir))
        assert str(failed.value).endswith(".parquet: No space left on device")
        # nothing lost, nothing half-written visible: the hot rows wait, readers see the old seal
        assert store.hot_rows() == waiting
        assert store.manifest.path.read_bytes() == manifest
        assert totals(data_dir) == before
        assert leftovers(volume) == []
        assert verify_ledger(data_dir).ok
        # ingest goes on while sealing is blocked, and a second try fails the same way
        ingest(store, message(3, 2000))
        with pytest.raises(SealError):
            store.seal()

        volume.release()
        result = store.seal()
        assert store.hot_rows() == 0
        assert [s.first_offset for s in result.sealed] == [2]
    count, by_unit = totals(data_dir)
    assert count == before[0] + len(BIG) + 1
    assert by_unit == {u: v * count // before[0] for u, v in before[1].items()}
    report = verify_ledger(data_dir)
    assert report.ok and report.notes == (), report


def test_a_manifest_that_cannot_be_written_keeps_the_old_one(volume):
    target = volume.folder("segments") / "manifest.json"
    atomic_write_bytes(target, b'{"version": 1, "segments": []}')
    volume.fill()
    with pytest.raises(OSError) as failed:
        atomic_write_bytes(target, b"x" * 100_000)
    assert failed.value.errno == errno.ENOSPC
    assert failed.value.filename == str(target)
    assert target.read_bytes() == b'{"version": 1, "segments": []}'
    assert leftovers(volume) == []


@pytest.fixture
def worker(tmp_path, volume):
    data_dir = tmp_path / "ledger"
    put_on(volume, data_dir, "segments", "archive")
    settings = WorkerSettings(
        bootstrap=("127.0.0.1:1",),
        group_id="test",
        samples_topic="samples",
        deadletter_topic="deadletter",
        alerts_topic="alerts",
        data_dir=data_dir,
        prices=PRICES,
        cost_centres={},
        seal_interval_s=0.0,
    )
    metrics = TallyMetrics(sections=("worker",))
    w = LedgerWorker(settings, metrics)
    yield w, metrics
    w.store.close()


def test_the_worker_reports_a_blocked_seal_once_and_resumes(worker, volume, caplog):
    w, metrics = worker

    def value(name: str) -> float | None:
        return metrics.registry.get_sample_value(name)

    ingest(w.store, message(0, *BIG))
    volume.fill()
    caplog.set_level(logging.DEBUG, logger="tally.worker")
    asyncio.run(w.seal())
    ingest(w.store, message(1, 1700))  # the next try writes another file, for the same reason
    asyncio.run(w.seal())  # a retry that fails again is counted, not logged as an error again
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, errors
    assert errors[0].startswith(f"sealing stopped: {w.settings.data_dir}/segments/")
    assert ".parquet: No space left on device;" in errors[0]
    assert value("tally_worker_seal_failures_total") == 2
    assert value("tally_worker_sealing_blocked") == 1
    assert (w.stats.seal_failures, w.store.hot_rows()) == (2, (len(BIG) + 1) * 4)

    volume.release()
    asyncio.run(w.seal())
    assert value("tally_worker_sealing_blocked") == 0
    assert value("tally_worker_seal_failures_total") == 2
    assert "sealing resumed after 2 failed tries" in caplog.text
    assert w.store.hot_rows() == 0
    assert totals(w.settings.data_dir)[0] == len(BIG) + 1
