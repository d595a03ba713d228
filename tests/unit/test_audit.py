"""The audit trail: the hash chain (append, verify, every kind of tampering named), filters, the
readers' copy on disk, and the entries the admin and jobs folds make, with what each change
replaced; through the real `Ingestor` into both stores."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner

from ledger.admin import (
    AdjustmentRecorded,
    BudgetGranted,
    PeriodClosed,
    PriceSet,
    QuotaSet,
    TeamDefined,
    admin_envelope,
    encode_admin,
)
from ledger.audit import (
    GENESIS,
    RECORD_FIELDS,
    UNRECORDED,
    AuditEntry,
    AuditFilter,
    AuditRecord,
    chain,
    record_from_dict,
    record_to_dict,
    select,
    verify_chain,
)
from ledger.errors import EventError, SegmentError
from ledger.ingest import ConsumedMessage, Ingestor
from ledger.job_events import FailReason, JobFailed, JobSpec, JobSubmitted, encode_job_event
from ledger.pricing import PriceBook
from ledger.store.hot import DuckDBStore
from ledger.store.memory import MemoryStore
from ledger.store.side_files import AUDIT_NAME, append_audit_file, load_audit_file
from ledger.units import Unit
from tally.cli import cli

T0 = 1_793_491_200_000_000  # 2026-11-01T00:00:00Z
HOUR = 3_600_000_000
SCHEDULER = "tally://scheduler"


def _entry(n: int, **overrides: Any) -> AuditEntry:
    fields: dict[str, Any] = {
        "event_id": f"e{n}",
        "time_us": T0 + n,
        "kind": "admin.price_set",
        "actor": "alice",
        "role": "admin",
        "client": "tally://admin",
        "subject": "A100",
        "reason": "list price",
        "before": '{"micros_per_gpu_hour":1}',
        "after": '{"micros_per_gpu_hour":2}',
    }
    return AuditEntry(**(fields | overrides))


def _trail(n: int = 5) -> list[AuditRecord]:
    return chain(None, [_entry(i) for i in range(1, n + 1)])


# ---------------------------------------------------------------------- the chain


def test_a_trail_chains_from_genesis_and_continues_after_its_last_record():
    first = chain(None, [_entry(1), _entry(2)])
    more = chain(first[-1], [_entry(3)])
    trail = first + more
    assert [r.seq for r in trail] == [1, 2, 3]
    assert trail[0].prev_hash == GENESIS
    assert [r.prev_hash for r in trail[1:]] == [r.record_hash for r in trail[:-1]]
    assert trail == chain(None, [_entry(1), _entry(2), _entry(3)])  # appending is chaining
    assert verify_chain(trail) is None
    assert verify_chain([]) is None


def _altered(value: Any) -> Any:
    if isinstance(value, int):
        return value + 1
    return "x" if value is None else value + "x"


@pytest.mark.parametrize("name", RECORD_FIELDS, ids=list(RECORD_FIELDS))
@pytest.mark.parametrize("at", [1, 3, 5], ids=["first", "middle", "last"])
def test_altering_any_field_of_any_record_is_named(name, at):
    stored = [record_to_dict(r) for r in _trail()]
    stored[at - 1][name] = _altered(stored[at - 1][name])
    broken = verify_chain([record_from_dict(d) for d in stored])
    assert broken is not None
    assert broken.position == at
    assert f"position {at}" in str(broken)


def test_a_record_rehashed_after_altering_it_breaks_the_next_link():
    trail = _trail()
    forged_entry = replace(trail[1].entry, actor="mallory")
    forged = chain(trail[0], [forged_entry])[0]  # a consistent hash for the forged content
    broken = verify_chain([trail[0], forged, *trail[2:]])
    assert broken is not None and broken.seq == 3
    assert "prev_hash" in broken.problem


@pytest.mark.parametrize(
    ("edit", "position"),
    [
        pytest.param(lambda t: t[:2] + t[3:], 3, id="dropped"),
        pytest.param(lambda t: [t[0], t[2], t[1], *t[3:]], 2, id="swapped"),
        pytest.param(lambda t: [t[0], t[0], *t[1:]], 2, id="duplicated"),
        pytest.param(lambda t: t[1:], 1, id="first-dropped"),
    ],
)
def test_dropping_moving_or_repeating_a_record_is_named(edit, position):
    broken = verify_chain(edit(_trail()))
    assert broken is not None and broken.position == position


def test_dropping_the_last_records_is_not_a_break():
    # a chain alone cannot tell a cut-off tail; the writer's table and rebuild compare lengths
    assert verify_chain(_trail()[:3]) is None


@pytest.mark.parametrize(
    ("where", "seqs"),
    [
        pytest.param(AuditFilter(), [1, 2, 3, 4], id="everything"),
        pytest.param(AuditFilter(actor="team:ml"), [3], id="actor"),
        pytest.param(AuditFilter(kind="job"), [3, 4], id="kind-family"),
        pytest.param(AuditFilter(kind="admin.price_set"), [1], id="kind"),
        pytest.param(AuditFilter(kind="admin.price"), [], id="no-partial-kind"),
        pytest.param(AuditFilter(since_us=T0 + 2), [2, 3, 4], id="since-inclusive"),
        pytest.param(AuditFilter(until_us=T0 + 3), [1, 2], id="until-exclusive"),
        pytest.param(AuditFilter(actor="alice", kind="admin"), [1, 2], id="both"),
    ],
)
def test_filters(where, seqs):
    trail = chain(
        None,
        [
            _entry(1),
            _entry(2, kind="admin.quota_set"),
            _entry(3, kind="job.submit", actor="team:ml", role="team:ml"),
            _entry(4, kind="job.cancel", actor="admin", role="admin"),
        ],
    )
    assert [r.seq for r in select(trail, where)] == seqs


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda d: d.pop("actor"), id="missing-field"),
        pytest.param(lambda d: d.update(extra=1), id="unknown-field"),
        pytest.param(lambda d: d.update(seq="1"), id="seq-not-int"),
        pytest.param(lambda d: d.update(actor=None), id="actor-null"),
        pytest.param(lambda d: d.update(before=3), id="before-not-text"),
    ],
)
def test_a_stored_record_of_the_wrong_shape_is_refused(change):
    stored = record_to_dict(_trail(1)[0])
    change(stored)
    with pytest.raises(EventError):
        record_from_dict(stored)


# ---------------------------------------------------------------------- the readers' copy


def test_the_file_is_appended_cut_at_a_torn_line_and_read_back(tmp_path: Path):
    trail = _trail()
    assert append_audit_file(tmp_path, trail[:2], None) == 2
    assert append_audit_file(tmp_path, trail[:3], 2) == 3  # only what it does not hold
    path = tmp_path / AUDIT_NAME
    path.write_bytes(path.read_bytes() + b'{"seq": 4, "ev')  # a crash mid-line
    assert append_audit_file(tmp_path, trail, None) == 5  # counted anew: the torn line is cut
    assert load_audit_file(tmp_path) == trail
    assert load_audit_file(tmp_path / "none") == []


def test_a_line_that_is_not_a_record_is_named(tmp_path: Path):
    append_audit_file(tmp_path, _trail(3), None)
    path = tmp_path / AUDIT_NAME
    lines = path.read_bytes().splitlines()
    path.write_bytes(b"\n".join([lines[0], b"{not json", lines[2]]) + b"\n")
    with pytest.raises(SegmentError, match="line 2"):
        load_audit_file(tmp_path)


# ---------------------------------------------------------------------- what the folds record


def _admin(offset: int, event: Any) -> ConsumedMessage:
    key, value = encode_admin(admin_envelope(event))
    return ConsumedMessage("tally.admin", 0, offset, value, key)


def _job(offset: int, event: Any) -> ConsumedMessage:
    return ConsumedMessage("tally.jobs", 0, offset, encode_job_event(event, SCHEDULER), b"j")


SPEC = JobSpec("job-1", "vision", "detection", "ada", "dev", 2, T0, HOUR)
ADMIN_EVENTS: list[Any] = [
    PriceSet("A100", None, 2_000_000, "alice", "list", T0),
    PriceSet("A100", None, 2_500_000, "bob", "raise", T0 + 1),
    TeamDefined("vision", "cc-1", ("detection",), ("ada",), "alice", "new", T0 + 2),
    TeamDefined("vision", "cc-2", ("detection",), ("ada",), "alice", "move", T0 + 3),
    TeamDefined("vision", "cc-2", ("detection",), ("ada",), "alice", "again", T0 + 4),
    QuotaSet("vision", "a100", "A100", 4, None, 2, "carol", "q", T0 + 5),
    BudgetGranted("vision", "2026-11", Unit.MONEY, 5_000_000, "dave", "grant", T0 + 6),
    BudgetGranted("vision", "2026-11", Unit.MONEY, 1_000_000, "dave", "top up", T0 + 7),
    AdjustmentRecorded(
        "consumer:vision/detection", Unit.MONEY, -1_000, "2026-11", "erin", "credit", T0 + 8
    ),
    PeriodClosed("2026-10", "frank", "month end", T0 + 9),
]
JOB_EVENTS: list[Any] = [
    JobSubmitted(SPEC, T0 + 10, requested_by="team:vision", client="10.0.0.7"),
    JobSubmitted(replace(SPEC, job_id="job-old"), T0 + 11),  # before events said who
    JobFailed("job-x", FailReason.EXIT_NONZERO, 1, False, T0 + 12, 3),  # not a state change
    JobFailed("job-1", FailReason.CANCELLED, 1, False, T0 + 13, None, "stop", None, "admin", "::1"),
    JobFailed("job-old", FailReason.CANCELLED, 1, False, T0 + 14, None, "scheduler stopped"),
]
EXPECTED: list[tuple[str, str, str, str, Any, Any]] = [  # kind, actor, role, subject, before, after
    ("admin.price_set", "alice", "admin", "A100", None, {"micros_per_gpu_hour": 2_000_000}),
    ("admin.price_set", "bob", "admin", "A100", {"micros_per_gpu_hour": 2_000_000},
     {"micros_per_gpu_hour": 2_500_000}),
    ("admin.team_defined", "alice", "admin", "vision", None, {"cost_centre": "cc-1"}),
    ("admin.team_defined", "alice", "admin", "vision", {"cost_centre": "cc-1"},
     {"cost_centre": "cc-2"}),
    # the same definition again changed nothing: not in the trail
    ("admin.quota_set", "carol", "admin", "vision", None, {"nominal_gpus": 4, "lending_limit": 2}),
    ("admin.budget_granted", "dave", "admin", "vision", {"granted": 0}, {"granted": 5_000_000}),
    ("admin.budget_granted", "dave", "admin", "vision", {"granted": 5_000_000},
     {"granted": 6_000_000}),
    ("admin.adjustment_recorded", "erin", "admin", "consumer:vision/detection", None,
     {"amount": -1_000, "booked_period": "2026-11"}),
    ("admin.period_closed", "frank", "admin", "2026-10", {"closed": False}, {"closed": True}),
    ("job.submit", "team:vision", "team:vision", "job-1", None, {"user": "ada", "gpus": 2}),
    ("job.submit", UNRECORDED, UNRECORDED, "job-old", None, {"state": "pending"}),
    ("job.cancel", "admin", "admin", "job-1", None, {"state": "cancelled"}),
    ("job.cancel", "scheduler", "scheduler", "job-old", None, {"state": "cancelled"}),
]  # fmt: skip


def _contains(text: str | None, wanted: Any) -> bool:
    if wanted is None:
        return text is None
    return text is not None and wanted.items() <= orjson.loads(text).items()


def _ingest(store: Any) -> Ingestor:
    ingestor = Ingestor(store, "c", PriceBook(()), {})
    ingestor.apply([_admin(i, e) for i, e in enumerate(ADMIN_EVENTS)])
    jobs = [_job(i, e) for i, e in enumerate(JOB_EVENTS)]
    ingestor.apply(jobs[:3])
    ingestor.apply([*jobs[3:], ConsumedMessage("tally.jobs", 0, 5, jobs[0].value, b"j")])
    return ingestor


@pytest.fixture(params=["duckdb", "memory"])
def store(request, tmp_path):
    if request.param == "memory":
        yield MemoryStore()
        return
    with DuckDBStore(tmp_path / "ledger") as duck:
        yield duck


def test_every_change_is_recorded_once_with_who_and_what_it_replaced(store):
    _ingest(store)
    trail = store.audit_records()
    assert verify_chain(trail) is None
    assert len(trail) == len(EXPECTED)
    for record, (kind, actor, role, subject, before, after) in zip(trail, EXPECTED, strict=True):
        e = record.entry
        assert (e.kind, e.actor, e.role, e.subject) == (kind, actor, role, subject), e
        assert _contains(e.before, before), e.before
        assert _contains(e.after, after), e.after
    submit, cancel = trail[9].entry, trail[11].entry
    assert (submit.client, cancel.client, trail[12].entry.client) == ("10.0.0.7", "::1", SCHEDULER)
    assert trail[0].entry.client == "tally://admin" and trail[0].entry.reason == "list"
    assert trail[0].entry.time_us == T0  # the event's time, never the clock


def test_both_stores_chain_the_same_records(tmp_path):
    memory = MemoryStore()
    _ingest(memory)
    with DuckDBStore(tmp_path / "ledger") as duck:
        _ingest(duck)
        assert duck.audit_records() == memory.audit_records()


def test_the_trail_survives_a_restart_and_continues_its_chain(tmp_path):
    with DuckDBStore(tmp_path / "ledger") as duck:
        Ingestor(duck, "c", PriceBook(()), {}).apply([_admin(0, ADMIN_EVENTS[0])])
        duck.seal()
    with DuckDBStore(tmp_path / "ledger") as duck:
        Ingestor(duck, "c", PriceBook(()), {}).apply(
            [_admin(1, ADMIN_EVENTS[1]), _admin(2, ADMIN_EVENTS[0])]  # a resend of the first
        )
        duck.seal()
        trail = duck.audit_records()
    assert [r.seq for r in trail] == [1, 2]
    assert verify_chain(trail) is None
    assert load_audit_file(tmp_path / "ledger" / "segments") == trail


# ---------------------------------------------------------------------- the commands


def test_tally_audit_filters_and_verify_names_an_altered_record(tmp_path):
    data_dir = tmp_path / "ledger"
    with DuckDBStore(data_dir) as duck:
        _ingest(duck)
        duck.seal()
    runner = CliRunner()

    def run(*args: str) -> Any:
        return runner.invoke(cli, [*args, "--data-dir", str(data_dir)])

    shown = run("audit", "--actor", "team:vision", "-o", "json")
    assert shown.exit_code == 0, shown.output
    [submit] = json.loads(shown.output)
    assert (submit["kind"], submit["client"], submit["after"]["user"]) == (
        "job.submit",
        "10.0.0.7",
        "ada",
    )
    rows = list(csv.DictReader(io.StringIO(run("audit", "--kind", "admin", "-o", "csv").output)))
    assert [r["actor"] for r in rows] == [e[1] for e in EXPECTED if e[0].startswith("admin")]
    table = run("audit", "--since", str(T0 + 13), "--until", str(T0 + 14)).output
    assert "job.cancel" in table and "job.submit" not in table
    assert run("ledger", "verify").exit_code == 0

    path = data_dir / "segments" / AUDIT_NAME
    lines = path.read_bytes().splitlines(keepends=True)
    record = orjson.loads(lines[5])  # the first grant: 5 becomes 50
    assert "5000000" in record["after"]
    record["after"] = record["after"].replace("5000000", "50000000")
    lines[5] = orjson.dumps(record) + b"\n"
    path.write_bytes(b"".join(lines))
    checked = run("ledger", "verify")
    assert checked.exit_code == 1, checked.output
    assert "audit record 6 (position 6)" in checked.output and "altered" in checked.output


def test_tally_audit_without_a_ledger_exits_4(tmp_path):
    result = CliRunner().invoke(cli, ["audit", "--data-dir", str(tmp_path / "nowhere")])
    assert result.exit_code == 4
