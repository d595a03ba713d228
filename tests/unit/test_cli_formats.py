"""`-o table|json|csv` on every command that offers it: JSON parses, CSV has the command's header
and its rows, the table is printed. The ledger commands read a small real ledger; the job and
queue commands talk to a real scheduler API (the service on the fake executor)."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from scheduler.executors.fake import RUNS_FOREVER
from tally.cli import cli
from tally.cli.job import JOB_COLUMNS, QUEUE_COLUMNS
from tally.cli.request import DETAIL
from tests.builders import a_config_dict
from tests.conftest import write_config
from tests.unit.test_cli import small_ledger
from tests.unit.test_requests import RID
from tests.unit.test_requests_cli import requests_ledger
from tests.unit.test_scheduler_api_cli import VISION, Served
from tests.unit.test_scheduler_service_support import Rig

PERIOD = "2026-11"  # the month of the small ledger's samples


@dataclass(frozen=True, slots=True)
class Case:
    argv: tuple[str, ...]  # {ledger}, {requests}, {config}, {tmp}, {job} are filled in
    header: tuple[str, ...]  # the CSV header
    keys: frozenset[str]  # keys of the JSON object, or of each element of a JSON list
    rows: int = 1  # at least this many CSV rows / JSON list elements
    code: int = 0


def case(
    argv: str, header: tuple[str, ...] | str, keys: str = "", rows: int = 1, code: int = 0
) -> Case:
    names = tuple(header.split(",")) if isinstance(header, str) else header
    given = frozenset(keys.split(",") if keys else names)
    return Case(tuple(argv.split()), names, given, rows, code)


JOB = tuple(JOB_COLUMNS)
JOB_KEYS = "job_id,team,queue,gpus,state,reason,submitted_us"  # JSON: the API's job records
VERIFY = (
    "ok,segments,rows,transactions,closed_periods,archive_segments,archived_messages,"
    "audit_records,problems,notes"
)
IDLE = (
    "scope,pool,model,team,allocated_gpu_hours,idle_gpu_hours,idle_waste,unallocated_gpu_hours,"
    "unallocated_cost,shared_unallocated"
)
FOCUS = "period,path,format,focus_version,rows,billed_cost,currency,gpu_hours"
REQUESTS = DETAIL
CASES: dict[str, Case] = {
    "admin apply": case(
        "admin apply {config} --dry-run --data-dir {ledger}", "event,entity,change"
    ),
    "audit": case(
        "audit --data-dir {ledger}",
        "seq,time,time_us,kind,actor,role,client,subject,reason,before,after,event_id,record_hash",
        rows=0,  # the small ledger has samples only: nothing in its audit trail
    ),
    "export focus": case(
        f"export focus --period {PERIOD} --out {{tmp}}/f.csv --data-dir {{ledger}}", FOCUS
    ),
    "ledger rebuild": case(
        "ledger rebuild --config {config} --data-dir {ledger}",
        "kind,subject,unit,period,live,rebuilt,note",
        keys="identical,source,batches,messages,rebuilt,differences",
        code=1,  # the config's price is not the small ledger's: the rebuild differs, in rows
    ),
    "ledger verify": case("ledger verify --data-dir {ledger}", VERIFY),
    "report balances": case("report balances --data-dir {ledger}", "account,unit,period,balance"),
    "report cost": case("report cost --data-dir {ledger}", "team,gpu_hours,cost"),
    "report idle": case("report idle --data-dir {ledger}", IDLE),
    "report refused": case(
        "report refused --data-dir {ledger}",
        "reason,topic,letters,first_recorded,last_recorded,example",
        rows=0,  # the small ledger refused nothing: the header alone, an empty list
    ),
    "report statement": case(
        f"report statement --team vision --period {PERIOD} --data-dir {{ledger}}",
        "section,name,gpu_hours,cost,idle_gpu_hours,idle_waste",
        keys="team,period,currency,gpu_ms,cost,total,by_project,by_user",
    ),
    "inventory list": case(
        "inventory list --data-dir {ledger}",
        "node,index,uuid,pool,model,memory_mib,mig,labels,topology,driver,cuda,health,health_reason,faults,"
        "cordoned,status,first_seen,last_seen",
        rows=0,  # the small ledger was fed samples, not inventory reports
    ),
    "whatif": case(
        "whatif -c {config} --since 2026-11-01 --until 2026-12-01 --data-dir {ledger}",
        "metric,scope,baseline,alternative",
        keys="since_us,until_us,jobs,rows,divergences,decisions_unchanged,flags,capacity",
    ),
    "job submit": case("job submit -q dev -p detection -- true", JOB, keys=JOB_KEYS),
    "job list": case("job list", JOB, keys=JOB_KEYS),
    "job cancel": case("job cancel {job}", JOB, keys=JOB_KEYS),
    "job explain": case("job explain {job}", "job_id,explanation"),
    "queue list": case("queue list", QUEUE_COLUMNS, keys="name,class,priority,pending,running"),
    "request list": case("request list --config {config} --data-dir {requests}", REQUESTS, rows=3),
    "request show": case(
        f"request show {RID} --config {{config}} --data-dir {{requests}}", REQUESTS
    ),
}
FORMATS = ("table", "json", "csv")


def _commands(
    command: click.Command, path: tuple[str, ...] = ()
) -> Iterator[tuple[str, click.Command]]:
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            yield from _commands(sub, (*path, name))
    else:
        yield " ".join(path), command


def test_every_command_with_an_output_option_is_tested_in_every_format():
    offering = {}
    for name, command in _commands(cli):
        for param in command.params:
            if param.name == "output":
                assert isinstance(param.type, click.Choice)
                offering[name] = tuple(param.type.choices)
    assert set(offering) == set(CASES)
    assert set(offering.values()) == {FORMATS}


@pytest.fixture(scope="module")
def ledger_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return small_ledger(tmp_path_factory.mktemp("formats") / "ledger")


@pytest.fixture(scope="module")
def requests_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return requests_ledger(tmp_path_factory.mktemp("formats") / "requests")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    rig = Rig(tmp_path_factory.mktemp("scheduler"))
    rig.executor.default = RUNS_FOREVER
    instance = Served(rig)
    try:
        yield instance
    finally:
        instance.close()


def _invoke(argv: list[str], served: Served) -> click.testing.Result:
    api = argv[0] in ("job", "queue")
    if api:
        argv = [argv[0], argv[1], "--api", served.url, *argv[2:]]
    # the API's commands with a team's token; the admin commands as the local operator (with a
    # team's token they would be refused: a team-lead writes no admin events)
    return CliRunner().invoke(cli, argv, env={"TALLY_TOKEN": VISION if api else None})


def _argv(
    name: str, fmt: str, tmp_path: Path, ledgers: tuple[Path, Path], served: Served
) -> list[str]:
    config = write_config(tmp_path / "tally.yaml", a_config_dict())
    job = ""
    if "{job}" in CASES[name].argv:  # a job of its own: a cancelled one cannot be cancelled again
        submitted = _invoke(["job", "submit", "-q", "dev", "-p", "detection", "--", "true"], served)
        assert submitted.exit_code == 0, submitted.output
        job = submitted.stdout.strip()
    ledger_dir, requests = ledgers
    fields = {
        "ledger": ledger_dir,
        "requests": requests,
        "config": config,
        "tmp": tmp_path,
        "job": job,
    }
    argv = [a.format(**fields) for a in CASES[name].argv]
    if argv[-2:] == ["--", "true"]:
        return [*argv[:-2], "-o", fmt, *argv[-2:]]
    return [*argv, "-o", fmt]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", list(CASES))
def test_the_output_format_is_honoured(tmp_path, ledger_dir, requests_dir, served, name, fmt):
    expected = CASES[name]
    result = _invoke(_argv(name, fmt, tmp_path, (ledger_dir, requests_dir), served), served)
    assert result.exit_code == expected.code, result.output
    out = result.stdout
    if fmt == "json":
        doc = json.loads(out)
        items = doc if isinstance(doc, list) else [doc]
        assert len(items) >= (expected.rows if isinstance(doc, list) else 1), out
        assert all(isinstance(i, dict) and expected.keys <= i.keys() for i in items), out
    elif fmt == "csv":
        table = list(csv.reader(io.StringIO(out)))
        assert tuple(table[0]) == expected.header, out
        assert len(table) - 1 >= expected.rows, out
        assert all(len(row) == len(expected.header) for row in table[1:]), out
    else:
        assert out.strip(), result.output
        with pytest.raises(json.JSONDecodeError):
            json.loads(out)
