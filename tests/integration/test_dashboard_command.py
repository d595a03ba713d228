"""`tally dashboard`: serves the Streamlit dashboard of a config's ledger as `tally up` does
(HTTP 200 on Streamlit's health path), stops cleanly on SIGTERM, and refuses a data directory
that holds no ledger (exit 4)."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import requests
from click.testing import CliRunner

from ledger.store.hot import DuckDBStore
from tally.broker import free_port
from tally.cli import cli
from tests.builders import a_config_dict
from tests.conftest import child_env, tally_command, write_config


def test_dashboard_serves_the_ledger_and_stops_cleanly(tmp_path):
    conf_dir = tmp_path / "etc"
    conf_dir.mkdir()
    DuckDBStore(conf_dir / "ledger").close()  # an (empty) ledger beside the config
    port = free_port()
    path = write_config(conf_dir / "c.yaml", a_config_dict(ledger={"data_dir": "ledger"}))
    log = tmp_path / "dashboard.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            tally_command("dashboard", "--config", str(path), "--port", str(port)),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=child_env(),
            cwd=tmp_path,  # not the config's directory: its relative data_dir still holds
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        answer = None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                answer = requests.get(f"http://127.0.0.1:{port}/_stcore/health", timeout=2)
                break
            except requests.ConnectionError:
                time.sleep(0.2)
        assert answer is not None, log.read_text(errors="replace")
        assert answer.status_code == 200
        assert answer.text == "ok"
        page = requests.get(f"http://127.0.0.1:{port}/", timeout=5)
        assert page.status_code == 200 and "<html" in page.text.lower()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        code = proc.wait(30)
    assert code == 0, log.read_text(errors="replace")
    assert f"dashboard at http://127.0.0.1:{port}" in log.read_text(errors="replace")


def test_dashboard_without_a_ledger_exits_4(tmp_path):
    path = write_config(tmp_path / "c.yaml", a_config_dict(ledger={"data_dir": "nothing"}))
    result = CliRunner().invoke(cli, ["dashboard", "--config", str(path)])
    assert result.exit_code == 4
    assert f"no ledger at {tmp_path.resolve() / 'nothing'}" in result.stderr


def test_dashboard_help_names_its_options():
    result = CliRunner().invoke(cli, ["dashboard", "--help"])
    assert result.exit_code == 0
    for option in ("--config", "--host", "--port"):
        assert option in result.output
