"""Times in the CLI's human tables on the ledger's clock (`ledger.timezone`), ISO 8601 with the
offset as `tally audit` prints them (`tally.output.shown_time`), and in UTC in CSV and JSON:
`tally job list|submit|cancel`'s `submitted`, `tally inventory list`'s `first_seen` and
`last_seen`, `tally request list|show`'s `opened`, `expires` and `decided` — on both sides of
the midnight (and month end) that Asia/Shanghai passes eight hours before UTC."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, tzinfo
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from click.testing import CliRunner

from ledger.admin.request_events import RequestStatus
from ledger.admin.requests import RequestState
from ledger.store.identity import claim_zone
from tally.cli import cli
from tally.cli.inventory import HEADERS, inventory_rows
from tally.cli.job import JOB_COLUMNS, _echo_jobs, job_row
from tally.cli.request import DETAIL, request_row
from tally.output import OutputFormat, shown_time
from tests.builders import a_config_dict
from tests.conftest import write_config
from tests.inventory_builders import a_record
from tests.unit.test_requests import BUDGET, RID
from tests.unit.test_requests_cli import requests_ledger

SHANGHAI = ZoneInfo("Asia/Shanghai")
BEFORE = 1_796_054_399_000_000  # 2026-11-30T15:59:59Z: 23:59:59 on 30 November in Shanghai
AFTER = 1_796_056_200_000_000  # 2026-11-30T16:30:00Z: 00:30 on 1 December in Shanghai
TABLE, JSON, CSV = OutputFormat.TABLE, OutputFormat.JSON, OutputFormat.CSV

CASES = [
    pytest.param(TABLE, UTC, "2026-11-30T15:59:59Z", "2026-11-30T16:30:00Z", id="table-utc"),
    pytest.param(
        TABLE, SHANGHAI, "2026-11-30T23:59:59+08:00", "2026-12-01T00:30:00+08:00",
        id="table-shanghai",
    ),
    pytest.param(CSV, SHANGHAI, "2026-11-30T15:59:59Z", "2026-11-30T16:30:00Z", id="csv-utc"),
    pytest.param(JSON, SHANGHAI, "2026-11-30T15:59:59Z", "2026-11-30T16:30:00Z", id="json-utc"),
]  # fmt: skip
ARGS = ("fmt", "zone", "before", "after")


@pytest.mark.parametrize(ARGS, CASES)
def test_a_jobs_submitted_time(fmt: OutputFormat, zone: tzinfo, before: str, after: str) -> None:
    job = {"job_id": "j", "team": "vision", "queue": "dev", "gpus": 1, "state": "pending",
           "reason": None, "attempt": 1}  # fmt: skip
    submitted = JOB_COLUMNS.index("submitted")
    assert job_row({**job, "submitted_us": BEFORE}, fmt, zone)[submitted] == before
    assert job_row({**job, "submitted_us": AFTER}, fmt, zone)[submitted] == after


@pytest.mark.parametrize(ARGS, CASES)
def test_a_gpus_first_and_last_seen(
    fmt: OutputFormat, zone: tzinfo, before: str, after: str
) -> None:
    gpu = a_record(first_seen_us=BEFORE, last_seen_us=AFTER)
    (row,) = inventory_rows([gpu], AFTER, 3, fmt, zone)
    assert (row[HEADERS.index("first_seen")], row[HEADERS.index("last_seen")]) == (before, after)


@pytest.mark.parametrize(ARGS, CASES)
def test_a_requests_opened_expires_and_decided(
    fmt: OutputFormat, zone: tzinfo, before: str, after: str
) -> None:
    opened = replace(BUDGET, effective_us=BEFORE, expires_us=AFTER)
    open_row = request_row(RequestState(opened), BEFORE, fmt, zone)
    assert (open_row["opened"], open_row["expires"], open_row["decided"]) == (before, after, "-")
    decided = RequestState(opened, RequestStatus.APPROVED, "fran", "finance", AFTER)
    assert request_row(decided, AFTER, fmt, zone)["decided"] == after


def test_job_list_reads_the_zone_from_the_configuration(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The job commands are the API's clients: the zone is the configuration's (UTC without
    one); CSV stays UTC."""
    config = write_config(tmp_path / "t.yaml", a_config_dict(ledger={"timezone": "Asia/Shanghai"}))
    job = {"job_id": "j", "team": "vision", "queue": "dev", "gpus": 1, "state": "pending",
           "reason": None, "attempt": 1, "submitted_us": AFTER}  # fmt: skip
    for fmt, path in ((TABLE, config), (TABLE, tmp_path / "none.yaml"), (CSV, config)):
        _echo_jobs([job], fmt, str(path))
    lines = capsys.readouterr().out.splitlines()  # each a heading and the job
    shanghai, utc, csv = lines[1], lines[3], lines[5]
    assert shanghai.endswith("2026-12-01T00:30:00+08:00")
    assert utc.endswith("2026-11-30T16:30:00Z") and csv.endswith(",2026-11-30T16:30:00Z")


def test_request_show_reads_the_zone_the_ledger_keeps(tmp_path: Path) -> None:
    data_dir = tmp_path / "ledger"
    claim_zone(data_dir, SHANGHAI)  # as the worker does before it makes the ledger
    requests_ledger(data_dir)
    argv = ["request", "show", RID, "--data-dir", str(data_dir), "--config", "none.yaml"]
    table = CliRunner().invoke(cli, argv)
    assert table.exit_code == 0, table.output
    opened = shown_time(BUDGET.effective_us, TABLE, SHANGHAI)
    assert opened.endswith("+08:00") and opened in table.stdout
    csv = CliRunner().invoke(cli, [*argv, "-o", "csv"])
    header, row = csv.stdout.strip().split("\n")
    assert header.split(",") == list(DETAIL)
    assert shown_time(BUDGET.effective_us, CSV, SHANGHAI).endswith("Z")
    assert shown_time(BUDGET.effective_us, CSV, SHANGHAI) in row
