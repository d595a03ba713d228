"""The cost-by-team view of the Finance page (Streamlit AppTest) on a seeded ledger and on an
empty one."""

from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from ledger.events import encode_batch
from ledger.ingest import ConsumedMessage, Ingestor
from ledger.pricing import Price, PriceBook
from ledger.read.queries import LedgerQueries
from ledger.store.hot import DuckDBStore
from tests.builders import INTERVAL_US, T0_US, a_process, an_envelope, an_owner
from tests.conftest import REPO

PAGE = str(REPO / "dashboard" / "app.py")


@pytest.fixture
def seeded(tmp_path):
    data_dir = tmp_path / "ledger"
    owners = [an_owner("vision"), an_owner("search", "ranking"), None]
    messages = []
    for t in range(360):  # one hour, three GPUs
        envelopes = [
            an_envelope(
                gpu_uuid=f"GPU-{i}",
                sample_time_us=T0_US + (t + 1) * INTERVAL_US,
                processes=(a_process(owner=o),) if o else (),
            )
            for i, o in enumerate(owners)
        ]
        messages.append(ConsumedMessage("s", 0, t, encode_batch(envelopes)))
    with DuckDBStore(data_dir) as store:
        Ingestor(store, "c", PriceBook((Price("*", 3_600_000),)), {}).apply(messages)
        store.seal()
    return data_dir


def _run(monkeypatch, data_dir):
    monkeypatch.setenv("TALLY_DATA_DIR", str(data_dir))
    app = AppTest.from_file(PAGE, default_timeout=30)
    return app.run()


def test_totals_shown_equal_the_ledger(monkeypatch, seeded):
    app = _run(monkeypatch, seeded)
    assert not app.exception
    frame = app.dataframe[0].value
    shown = {row.team: round(row.cost, 6) for row in frame.itertuples()}
    expected = {r.keys[0]: r.money_micros / 1e6 for r in LedgerQueries(seeded).cost_by(["team"])}
    assert shown == expected
    assert shown == {"vision": 3.6, "search": 3.6}  # one GPU-hour each at 3.60


def test_bucket_choice_changes_the_series(monkeypatch, seeded):
    app = _run(monkeypatch, seeded)
    assert app.subheader[0].value == "Cost by team per day"
    app.radio(key="bucket").set_value("hour").run()
    assert not app.exception
    assert app.subheader[0].value == "Cost by team per hour"


def test_empty_ledger_shows_what_to_expect(monkeypatch, tmp_path):
    app = _run(monkeypatch, tmp_path / "nothing-yet")
    assert not app.exception
    assert "No sealed usage yet" in app.info[0].value
    assert len(app.dataframe) == 0
