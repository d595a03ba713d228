"""What an operator meets when something is off: a job command's own options after `--`, a
--data-dir that holds no ledger, an internal error, and `-o csv|json` on every command."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

import tally.cli
from ledger.store.hot import DuckDBStore
from ledger.store.layout import has_ledger
from tally.broker import free_port
from tally.cli import cli
from tests.builders import a_config_dict
from tests.conftest import child_env, tally_command, write_config
from tests.unit.test_cli import small_ledger


@pytest.fixture
def ledger_dir(tmp_path: Path) -> Path:
    return small_ledger(tmp_path / "ledger")


# ------------------------------------------------------ a job's own options are not Faust's


class _Recorder(BaseHTTPRequestHandler):
    """A scheduler API stand-in: records each submitted body, answers with a job id."""

    bodies: list[dict[str, Any]]

    def do_POST(self) -> None:
        length = int(self.headers["Content-Length"])
        self.bodies.append(json.loads(self.rfile.read(length)))
        answer = json.dumps({"job": {"job_id": "job-1"}}).encode()
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: Any) -> None:
        del format, args


@pytest.fixture
def scheduler_api() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    bodies: list[dict[str, Any]] = []
    handler = type("Recorder", (_Recorder,), {"bodies": bodies})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", bodies
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


JOB_COMMANDS = [
    pytest.param(["nvidia-smi", "-L"], id="nvidia-smi -L"),
    pytest.param(["nvidia-smi", "-l", "5"], id="nvidia-smi -l 5"),
    pytest.param(["python", "serve.py", "--loop", "uvloop"], id="--loop uvloop"),
    pytest.param(["python", "serve.py", "--loop=eventlet", "-L", "x"], id="--loop=eventlet -L x"),
]


def _submit(api: str, command: list[str]) -> subprocess.CompletedProcess[str]:
    """`tally job submit` in a child process: Faust, once imported, reads the real argv."""
    argv = ["job", "submit", "-q", "dev", "-p", "detection", "--api", api, "--token", "t"]
    return subprocess.run(
        tally_command(*argv, "--", *command),
        capture_output=True,
        text=True,
        env=child_env(),
        check=False,
        timeout=60,
    )


@pytest.mark.parametrize("command", JOB_COMMANDS)
def test_a_job_command_reaches_the_scheduler_as_given(scheduler_api, command):
    api, bodies = scheduler_api
    result = _submit(api, command)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "job-1"
    assert [b["command"] for b in bodies] == [command]


@pytest.mark.parametrize("command", JOB_COMMANDS)
def test_a_job_command_to_an_unreachable_scheduler_is_a_connection_error(command):
    result = _submit(f"http://127.0.0.1:{free_port()}", command)
    assert result.returncode == 3, result.stderr
    assert "could not be reached" in result.stderr
    assert "Usage" not in result.stderr and "Traceback" not in result.stderr


_NO_FAUST = """
import sys
from tally.cli import main
sys.argv = ["tally", *sys.argv[1:]]
try:
    main()
except SystemExit:
    pass
assert "faust" not in sys.modules, "the CLI imported faust"
"""


def test_importing_the_cli_does_not_import_faust():
    code = "import sys, tally.cli; assert 'faust' not in sys.modules, 'faust imported'"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=child_env(), check=False
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["--help"], id="tally --help"),
        pytest.param(["worker", "--help"], id="tally worker --help"),
        pytest.param(["job", "submit", "--help"], id="tally job submit --help"),
        pytest.param(["ledger", "verify", "--data-dir", "/nonexistent"], id="tally ledger verify"),
    ],
)
def test_running_a_command_does_not_import_faust(args):
    result = subprocess.run(
        [sys.executable, "-c", _NO_FAUST, *args],
        capture_output=True,
        text=True,
        env=child_env(),
        check=False,
    )
    assert result.returncode == 0, result.stderr


# ------------------------------------------------------------ a --data-dir with no ledger


# Every `tally` command, by what it does with a ledger (the README's table, "Exit codes"):
#   reads:   reads or changes an existing ledger; no ledger at --data-dir is exit 4
#   creates: its job is to create the ledger when there is none, and it says so
#   none:    never opens a ledger
LEDGER_USE: dict[str, str] = {
    "admin apply": "reads",  # the admin state applied so far (--initial: none yet is fine)
    "alerts run": "none",  # its delivery log lives under the data dir, created if missing
    "alerts test": "none",
    "audit": "reads",
    "collect": "none",
    "config check": "none",
    "dashboard": "reads",  # exit 4 at once; on a ledger it runs Streamlit (test_dashboard_command)
    "export focus": "reads",
    "inventory cordon": "reads",  # the sealed inventory names the target; sends an admin event
    "inventory list": "reads",
    "inventory uncordon": "reads",
    "job cancel": "none",
    "job explain": "none",
    "job list": "none",
    "job show": "none",
    "job submit": "none",
    "ledger adjust": "reads",  # --reverse reads the transaction; the adjusted ledger must exist
    "ledger close": "reads",  # the periods closed so far
    "ledger rebuild": "reads",
    "ledger seal": "reads",
    "ledger verify": "reads",
    "queue list": "none",
    "request approve": "reads",  # the request to approve, as the worker applied it
    "request budget": "reads",  # the team's applied admin state
    "request expire": "reads",
    "request list": "reads",
    "request quota": "reads",  # the team's applied quota: does the request raise borrowing?
    "request reject": "reads",
    "request show": "reads",
    "report balances": "reads",
    "report cost": "reads",
    "report idle": "reads",
    "report refused": "reads",
    "report statement": "reads",
    "scheduler run": "none",
    "up": "creates",  # through the worker it starts; its banner says so
    "worker": "creates",  # tests/integration/test_worker_new_ledger.py
    "whatif": "reads",  # the archived jobs topic
}

ADJUSTMENT = [
    *("--account", "consumer:vision/detection", "--amount", "-1.00", "--unit", "money"),
    *("--period", "2026-11", "--reason", "credit"),
]
ASKING = ("--team", "vision", "--reason", "r", "--config", "{config}")
LEDGER_COMMANDS: dict[str, list[str]] = {
    "ledger verify": ["ledger", "verify"],
    "ledger seal": ["ledger", "seal"],
    "ledger rebuild": ["ledger", "rebuild", "--config", "{config}"],
    "ledger adjust": ["ledger", "adjust", *ADJUSTMENT, "--dry-run"],
    "ledger close": ["ledger", "close", "2026-10", "--dry-run"],
    "admin apply": ["admin", "apply", "{config}", "--dry-run"],
    "report cost": ["report", "cost"],
    "inventory list": ["inventory", "list"],
    "report idle": ["report", "idle"],
    "report statement": ["report", "statement", "--team", "vision", "--period", "2026-11"],
    "report balances": ["report", "balances"],
    "report refused": ["report", "refused"],
    "audit": ["audit"],
    "export focus": ["export", "focus", "--period", "2026-11", "--out", "{tmp}/focus.csv"],
    "request budget": ["request", "budget", *ASKING, "--period", "2026-11", "--money", "5",
                       "--dry-run"],
    "request quota": ["request", "quota", *ASKING, "--pool", "h100", "--model", "H100",
                      "--gpus", "2", "--dry-run"],
    "request expire": ["request", "expire", "--dry-run", "--config", "{config}"],
    "request list": ["request", "list", "--config", "{config}"],
    "whatif": ["whatif", "-c", "{config}", "--since", "2026-11-01", "--until", "2026-11-02"],
}  # fmt: skip
# ...and what exits 4 without a ledger but does not succeed on a fresh one
NO_LEDGER_ONLY: dict[str, list[str]] = {
    "request approve": ["request", "approve", "req-1", "--comment", "c", "--config", "{config}"],
    "request reject": ["request", "reject", "req-1", "--comment", "c", "--config", "{config}"],
    "request show": ["request", "show", "req-1", "--config", "{config}"],
    "ledger adjust --reverse": ["ledger", "adjust", "--reverse", "t1", "--reason", "typo"],
    "dashboard": ["dashboard", "--config", "{config}"],
    "inventory cordon": ["inventory", "cordon", "GPU-x", "--reason", "r", "--config", "{config}"],
    "inventory uncordon": [
        "inventory",
        "uncordon",
        "GPU-x",
        "--reason",
        "r",
        "--config",
        "{config}",
    ],
}


def _leaves(command: click.Command, path: tuple[str, ...] = ()) -> Iterator[str]:
    if isinstance(command, click.Group):
        for name, sub in sorted(command.commands.items()):
            yield from _leaves(sub, (*path, name))
    else:
        yield " ".join(path)


def test_every_command_is_in_the_ledger_table_and_every_reader_is_tested():
    assert sorted(_leaves(cli)) == sorted(LEDGER_USE)
    readers = {name for name, use in LEDGER_USE.items() if use == "reads"}
    assert readers == set(LEDGER_COMMANDS) | (set(NO_LEDGER_ONLY) & set(LEDGER_USE))


def _args(tmp: Path, command: str) -> list[str]:
    config = write_config(tmp / "tally.yaml", a_config_dict())
    argv = {**LEDGER_COMMANDS, **NO_LEDGER_ONLY}[command]
    return [a.format(config=config, tmp=tmp) for a in argv]


@pytest.mark.parametrize("where", ["missing", "empty"])
@pytest.mark.parametrize("command", [*LEDGER_COMMANDS, *NO_LEDGER_ONLY])
def test_a_data_dir_without_a_ledger_exits_4(tmp_path, command, where):
    data_dir = tmp_path / "ledger"
    if where == "empty":
        data_dir.mkdir()
    result = CliRunner().invoke(cli, [*_args(tmp_path, command), "--data-dir", str(data_dir)])
    assert result.exit_code == 4, result.output
    assert f"no ledger at {data_dir}" in result.stderr
    assert "ledger OK" not in result.output
    assert not (data_dir / "hot.duckdb").exists()  # nothing was created at the typo


def test_the_first_admin_apply_may_plan_against_no_ledger_yet(tmp_path):
    data_dir = tmp_path / "ledger"
    args = [*_args(tmp_path, "admin apply"), "--data-dir", str(data_dir), "-o", "json"]
    result = CliRunner().invoke(cli, [*args, "--initial"])
    assert result.exit_code == 0, result.output
    assert f"note: no ledger at {data_dir} yet: planning against an empty one" in result.stderr
    planned = [row["event"] for row in json.loads(result.stdout)]
    assert planned == ["team_defined", "team_defined", "price_set"]
    assert not data_dir.exists()  # planning creates nothing


@pytest.mark.parametrize("command", list(LEDGER_COMMANDS))
def test_a_fresh_ledger_is_a_ledger(tmp_path, command):
    """What the worker creates when it starts (`make up`): no segments yet."""
    data_dir = tmp_path / "ledger"
    DuckDBStore(data_dir).close()
    result = CliRunner().invoke(cli, [*_args(tmp_path, command), "--data-dir", str(data_dir)])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        pytest.param([], False, id="empty"),
        pytest.param(["segments/"], False, id="segments-dir-only"),
        pytest.param(["archive/manifest.json"], False, id="archive-only"),
        pytest.param(["hot.duckdb"], True, id="hot-db"),
        pytest.param(["segments/manifest.json"], True, id="postings-manifest"),
    ],
)
def test_has_ledger(tmp_path, files, expected):
    for name in files:
        path = tmp_path / name
        if name.endswith("/"):
            path.mkdir(parents=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("")
    assert has_ledger(tmp_path) is expected
    assert has_ledger(tmp_path / "missing") is False


# ---------------------------------------------------------------------------- internal errors


def _run_main(monkeypatch, capsys, *args: str) -> tuple[int, str]:
    monkeypatch.setattr(sys, "argv", ["tally", *args])
    with pytest.raises(SystemExit) as exited:
        tally.cli.main()
    code = exited.value.code
    assert isinstance(code, int)
    return code, capsys.readouterr().err


@pytest.fixture
def a_bug(monkeypatch, tmp_path):
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("boom\non two lines")

    monkeypatch.setattr("tally.cli.report.cost_report", broken)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))


def test_an_internal_error_exits_70_with_one_line_naming_the_traceback_file(
    a_bug, monkeypatch, capsys, ledger_dir
):
    code, err = _run_main(monkeypatch, capsys, "report", "cost", "--data-dir", str(ledger_dir))
    assert code == 70
    (line,) = err.splitlines()
    prefix = "tally: internal error: RuntimeError: boom on two lines (traceback in "
    assert line.startswith(prefix) and line.endswith(")")
    traceback = Path(line.removeprefix(prefix).removesuffix(")")).read_text()
    assert traceback.startswith("Traceback") and "RuntimeError: boom" in traceback


def test_an_internal_error_with_debug_prints_the_traceback(a_bug, monkeypatch, capsys, ledger_dir):
    code, err = _run_main(
        monkeypatch, capsys, "--debug", "report", "cost", "--data-dir", str(ledger_dir)
    )
    assert code == 70
    assert err.startswith("Traceback")
    assert err.splitlines()[-1] == (
        "tally: internal error: RuntimeError: boom on two lines (traceback in the lines above)"
    )


def test_a_failed_check_still_exits_1_through_main(monkeypatch, capsys, ledger_dir):
    segment = next((ledger_dir / "segments").rglob("*.parquet"))
    segment.write_bytes(b"not parquet any more")
    code, _ = _run_main(monkeypatch, capsys, "ledger", "verify", "--data-dir", str(ledger_dir))
    assert code == 1


# ------------------------------------------------------------------------- -o csv and -o json


def test_verify_csv(ledger_dir):
    result = CliRunner().invoke(
        cli, ["ledger", "verify", "--data-dir", str(ledger_dir), "-o", "csv"]
    )
    assert result.exit_code == 0, result.output
    (row,) = list(csv.DictReader(io.StringIO(result.output)))
    assert row["ok"] == "true"
    assert (row["transactions"], row["problems"]) == ("3", "")


def test_verify_json(ledger_dir):
    result = CliRunner().invoke(
        cli, ["ledger", "verify", "--data-dir", str(ledger_dir), "-o", "json"]
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert (summary["ok"], summary["transactions"], summary["problems"]) == (True, 3, [])


def test_verify_csv_lists_the_problems(ledger_dir):
    segment = next((ledger_dir / "segments").rglob("*.parquet"))
    segment.write_bytes(b"not parquet any more")
    result = CliRunner().invoke(
        cli, ["ledger", "verify", "--data-dir", str(ledger_dir), "-o", "csv"]
    )
    assert result.exit_code == 1
    (row,) = list(csv.DictReader(io.StringIO(result.output)))
    assert row["ok"] == "false" and "checksum does not match" in row["problems"]


# ------------------------------------------------------------- stdout closed early (| head)


BROKEN_PIPE: dict[str, list[str]] = {
    "report cost -o csv": ["report", "cost", "-o", "csv", "--data-dir", "{ledger}"],
    "ledger verify -o json": ["ledger", "verify", "-o", "json", "--data-dir", "{ledger}"],
    "--help": ["--help"],
    "report cost --help": ["report", "cost", "--help"],
}


@pytest.mark.parametrize("command", list(BROKEN_PIPE))
def test_a_closed_stdout_exits_141_without_a_word(ledger_dir, command):
    """The reader is gone before the first write (`| head -0`, a pager quit at once)."""
    args = [a.format(ledger=ledger_dir) for a in BROKEN_PIPE[command]]
    read_end, write_end = os.pipe()
    os.close(read_end)  # closed before the child starts: its first write is a broken pipe
    try:
        result = subprocess.run(
            tally_command(*args),
            stdout=write_end,
            stderr=subprocess.PIPE,
            env=child_env(),
            check=False,
            timeout=60,
        )
    finally:
        os.close(write_end)
    assert result.returncode == 141, result.stderr.decode()
    assert result.stderr == b""


def test_head_1_of_a_long_output_ends_quietly(tmp_path):
    """`tally collect --once … | head -1` of 40 nodes × 8 GPUs (~350 kB of JSON): the reader
    takes one line and goes. 141 when the child's next write fails; 0 when the kernel took part
    of its last write before the reader went (CPython then reports no error)."""
    pools = [{"name": "h100", "model": "NVIDIA H100 80GB HBM3", "nodes": 40, "gpus_per_node": 8}]
    config = write_config(tmp_path / "tally.yaml", a_config_dict(fleet={"seed": 7, "pools": pools}))
    proc = subprocess.Popen(
        tally_command("collect", "--source", "sim", "--once", "--config", str(config)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=child_env(),
    )
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read()
    proc.stderr.close()
    code = proc.wait(60)
    assert first == b"[\n"
    assert code in (0, 141), err.decode()
    assert err == b""
