"""The `tally` CLI: help everywhere, meaningful exit codes, errors without tracebacks."""

from __future__ import annotations

import subprocess
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from ledger.events import encode_batch
from ledger.ingest import ConsumedMessage, Ingestor
from ledger.pricing import Price, PriceBook
from ledger.store.hot import DuckDBStore
from tally.cli import cli
from tests.builders import INTERVAL_US, T0_US, a_config_dict, an_envelope
from tests.conftest import child_env, tally_command, write_config


def _commands(group: click.Group, prefix: tuple[str, ...] = ()):
    for name, command in group.commands.items():
        yield (*prefix, name)
        if isinstance(command, click.Group):
            yield from _commands(command, (*prefix, name))


@pytest.mark.parametrize("path", list(_commands(cli)), ids=" ".join)
def test_every_command_has_help(path):
    result = CliRunner().invoke(cli, [*path, "--help"])
    assert result.exit_code == 0
    assert "Usage:" in result.output


def small_ledger(data_dir: Path) -> Path:
    """A ledger of three sealed transactions (one team, one price) in `data_dir`."""
    with DuckDBStore(data_dir) as store:
        messages = [
            ConsumedMessage(
                "s", 0, i, encode_batch([an_envelope(sample_time_us=T0_US + (i + 1) * INTERVAL_US)])
            )
            for i in range(3)
        ]
        Ingestor(store, "c", PriceBook((Price("*", 3_600_000),)), {}).apply(messages)
        store.seal()
    return data_dir


@pytest.fixture
def ledger_dir(tmp_path):
    return small_ledger(tmp_path / "ledger")


def test_invalid_config_exits_2_with_file_field_and_problem(tmp_path):
    path = write_config(tmp_path / "bad.yaml", a_config_dict(sampling={"interval_s": "fast"}))
    result = subprocess.run(
        tally_command("config", "check", str(path)),
        capture_output=True,
        text=True,
        env=child_env(),
        check=False,
    )
    assert result.returncode == 2
    assert f"{path}: sampling.interval_s: Input should be a valid number" in result.stderr
    assert "Traceback" not in result.stderr


def test_config_check_ok(tmp_path):
    path = write_config(tmp_path / "ok.yaml", a_config_dict())
    result = CliRunner().invoke(cli, ["config", "check", str(path)])
    assert result.exit_code == 0
    assert "OK (2 teams, 4 simulated GPUs" in result.output


def test_verify_passes_on_a_sound_ledger(ledger_dir):
    result = CliRunner().invoke(
        cli, ["ledger", "verify", "--data-dir", str(ledger_dir), "-o", "json"]
    )
    assert result.exit_code == 0, result.output
    assert '"ok": true' in result.output
    assert '"transactions": 3' in result.output


def test_verify_exits_1_on_damage(ledger_dir):
    segment = next((ledger_dir / "segments").rglob("*.parquet"))
    segment.write_bytes(b"not parquet any more")
    result = CliRunner().invoke(cli, ["ledger", "verify", "--data-dir", str(ledger_dir)])
    assert result.exit_code == 1
    assert "checksum does not match" in result.output


@pytest.mark.parametrize(
    ("fmt", "expected"),
    [
        pytest.param("csv", "team,gpu_hours,cost\nvision,0.008,0.030000", id="csv"),
        pytest.param("json", '"team": "vision"', id="json"),
        pytest.param("table", "vision", id="table"),
    ],
)
def test_report_cost_formats(ledger_dir, fmt, expected):
    result = CliRunner().invoke(
        cli, ["report", "cost", "--data-dir", str(ledger_dir), "--by", "team", "-o", fmt]
    )
    assert result.exit_code == 0, result.output
    assert expected in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["--by", "colour"], "--by: unknown dimension colour", id="bad-dimension"),
        pytest.param(
            ["--period", "November"], "--period: 'November' is not a month", id="bad-period"
        ),
    ],
)
def test_report_cost_bad_usage_exits_2(ledger_dir, args, message):
    result = CliRunner().invoke(cli, ["report", "cost", "--data-dir", str(ledger_dir), *args])
    assert result.exit_code == 2
    assert message in result.output


def test_report_on_an_empty_ledger_says_so(tmp_path):
    DuckDBStore(tmp_path / "fresh").close()  # what the worker creates before it seals anything
    result = CliRunner().invoke(cli, ["report", "cost", "--data-dir", str(tmp_path / "fresh")])
    assert result.exit_code == 0
    assert "no sealed usage" in result.output


def test_worker_without_a_broker_address_is_a_usage_error(tmp_path):
    path = write_config(tmp_path / "c.yaml", a_config_dict())
    result = subprocess.run(
        tally_command("worker", "--config", str(path)),
        capture_output=True,
        text=True,
        env=child_env(TALLY_BOOTSTRAP=""),
        check=False,
    )
    assert result.returncode == 2
    assert "runs only under `tally up`" in result.stderr


def test_collect_once_prints_a_round_of_events(tmp_path):
    path = write_config(tmp_path / "c.yaml", a_config_dict())
    result = CliRunner().invoke(cli, ["collect", "--config", str(path), "--once"])
    assert result.exit_code == 0, result.output
    assert result.output.count('"type": "tally.gpu.sample"') == 4
