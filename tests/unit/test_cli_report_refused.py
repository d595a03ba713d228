"""`tally report refused`: the sealed ledger's dead letters by reason and topic, so what was
refused as too late to deduplicate (or for any other reason) is visible, never silent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ledger.events import encode_batch
from ledger.ingest import ConsumedMessage, Ingestor
from ledger.pricing import Price, PriceBook
from ledger.store.hot import DuckDBStore
from tally.cli import cli
from tests.builders import INTERVAL_US, T0_US, an_envelope

DAY_US = 86_400_000_000


def run(*args: object):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(cli, [str(a) for a in args])


def sample(day: int) -> bytes:
    return encode_batch([an_envelope(sample_time_us=T0_US + day * DAY_US + INTERVAL_US)])


@pytest.fixture(scope="module")
def refused_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ledger that refused garbage once and two resends after the dedupe window."""
    data_dir = tmp_path_factory.mktemp("refused") / "ledger"
    with DuckDBStore(data_dir) as store:
        ingestor = Ingestor(store, "c", PriceBook((Price("*", 3_600_000),)), {})
        values = [sample(0), sample(1), sample(10), b"{not json"]
        for offset, value in enumerate(values):
            ingestor.apply([ConsumedMessage("tally.samples", 0, offset, value)])
        store.prune_seen_events(7 * DAY_US)
        for offset, value in enumerate([sample(0), sample(1), sample(10)], start=len(values)):
            ingestor.apply([ConsumedMessage("tally.samples", 0, offset, value)])
        store.seal()
    return data_dir


def test_help() -> None:
    result = run("report", "refused", "--help")
    assert result.exit_code == 0 and "too late to deduplicate" in " ".join(result.output.split())


def test_json_groups_the_letters_by_reason_and_topic(refused_dir: Path) -> None:
    result = run("report", "refused", "--data-dir", refused_dir, "-o", "json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert [(r["reason"], r["topic"], r["letters"]) for r in rows] == [
        ("too late to deduplicate", "tally.samples", 2),
        ("not JSON", "tally.samples", 1),
    ]
    late = rows[0]
    assert late["first_recorded"] <= late["last_recorded"]
    assert late["example"].startswith("too late to deduplicate: its time ")
    assert "gpu:GPU-" in late["example"]


def test_table_and_csv(refused_dir: Path) -> None:
    table = run("report", "refused", "--data-dir", refused_dir)
    assert table.exit_code == 0
    head = table.output.splitlines()[0]
    assert head.split() == ["REASON", "TOPIC", "LETTERS", "FIRST_RECORDED", "LAST_RECORDED"]
    assert "too late to deduplicate" in table.output and "EXAMPLE" not in head
    csv = run("report", "refused", "--data-dir", refused_dir, "-o", "csv").output.splitlines()
    assert csv[0] == "reason,topic,letters,first_recorded,last_recorded,example"
    assert csv[1].startswith("too late to deduplicate,tally.samples,2,")


def test_a_ledger_that_refused_nothing(tmp_path: Path) -> None:
    with DuckDBStore(tmp_path / "ledger") as store:
        store.seal()
    result = run("report", "refused", "--data-dir", tmp_path / "ledger")
    assert (result.exit_code, result.output) == (0, "nothing refused in the sealed ledger\n")
    as_json = run("report", "refused", "--data-dir", tmp_path / "ledger", "-o", "json")
    assert json.loads(as_json.output) == []


def test_no_ledger_exits_4(tmp_path: Path) -> None:
    result = run("report", "refused", "--data-dir", tmp_path / "nowhere")
    assert result.exit_code == 4
    assert f"no ledger at {tmp_path / 'nowhere'}" in result.output
