"""The dashboard's Audit page (Streamlit AppTest) on the seeded ledger: it lists the sealed
audit trail newest first, its filters narrow it as `ledger.audit.select` does, and a record
altered on disk shows the chain broken; on an empty ledger it says what will appear."""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson
import pytest

from ledger.audit import AuditFilter, select
from ledger.read.audit import audit_trail
from ledger.store.side_files import AUDIT_NAME
from tests.unit.test_dashboard_pages import _app, _frame, _metric
from tests.unit.test_dashboard_seed import seed_ledger

AUDIT = "page_audit.py"


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return seed_ledger(tmp_path_factory.mktemp("audit") / "ledger")


def test_the_page_lists_the_trail_and_its_filters_narrow_it(monkeypatch, seeded):
    records = audit_trail(seeded)
    kinds = {r.entry.kind for r in records}
    assert {"admin.quota_set", "job.submit"} <= kinds, kinds
    app = _app(monkeypatch, seeded, AUDIT)
    frame = _frame(app, "actor")
    assert list(frame["seq"]) == [r.seq for r in reversed(records)]
    assert _metric(app, "Hash chain") == "intact"
    assert _metric(app, "Records shown") == f"{len(records):,} of {len(records):,}"
    app.selectbox(key="audit_kind").set_value("admin").run()
    wanted = select(records, AuditFilter(kind="admin"))
    assert 0 < len(wanted) < len(records)
    assert list(_frame(app, "actor")["seq"]) == [r.seq for r in reversed(wanted)]
    actor = wanted[0].entry.actor
    app.selectbox(key="audit_actor").set_value(actor).run()
    both = select(records, AuditFilter(actor=actor, kind="admin"))
    assert list(_frame(app, "actor")["actor"]) == [actor] * len(both)


def test_an_altered_record_shows_the_chain_broken(monkeypatch, seeded, tmp_path):
    data_dir = Path(shutil.copytree(seeded, tmp_path / "ledger"))
    path = data_dir / "segments" / AUDIT_NAME
    lines = path.read_bytes().splitlines(keepends=True)
    record = orjson.loads(lines[1])
    record["actor"] = "mallory"
    lines[1] = orjson.dumps(record) + b"\n"
    path.write_bytes(b"".join(lines))
    app = _app(monkeypatch, data_dir, AUDIT)
    assert _metric(app, "Hash chain") == "BROKEN"
    assert any("audit record 2 (position 2)" in e.value for e in app.error)


def test_an_empty_ledger_says_what_will_appear(monkeypatch, tmp_path):
    app = _app(monkeypatch, tmp_path / "nothing-yet", AUDIT)
    assert any("No audit records yet" in i.value for i in app.info)
    assert len(app.dataframe) == 0


def test_the_requests_show_with_their_status_now(monkeypatch, tmp_path):
    from tests.unit.test_requests import QID, RID
    from tests.unit.test_requests_cli import OTHER, requests_ledger

    app = _app(monkeypatch, requests_ledger(tmp_path / "ledger"), AUDIT)
    frame = _frame(app, "approvers")
    assert dict(zip(frame["request"], frame["status"], strict=True)) == {
        RID: "open",
        QID: "expired",  # open, but past its expiry by now
        OTHER: "rejected",
    }
    app.selectbox(key="requests_status").set_value("open").run()
    assert list(_frame(app, "approvers")["request"]) == [RID]
