"""`tally collect` against a real dcgm-exporter-shaped HTTP endpoint on loopback."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from tally.cli import cli
from tests.builders import a_config_dict
from tests.conftest import REPO, write_config

PAYLOAD = (REPO / "tests/fixtures/dcgm/h100_8gpu_pods.txt").read_bytes()


@pytest.fixture
def exporter() -> Iterator[str]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(PAYLOAD)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    finally:
        server.shutdown()


def test_dcgm_once_prints_the_scraped_samples(exporter: str, tmp_path: Path) -> None:
    path = write_config(tmp_path / "c.yaml", a_config_dict())
    result = CliRunner().invoke(
        cli,
        [
            "collect",
            "--config",
            str(path),
            "--source",
            "dcgm",
            "--url",
            exporter,
            "--pool",
            "a100",
            "--once",
        ],
    )
    assert result.exit_code == 0, result.output
    events = orjson.loads(result.output)
    assert events
    assert {e["data"]["source"] for e in events} == {"dcgm"}
    assert {e["data"]["pool"] for e in events} == {"a100"}
    assert all(e["source"].startswith("dcgm://") for e in events)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["--source", "dcgm"], "--source dcgm needs --url", id="dcgm-without-url"),
        pytest.param(
            ["--source", "dcgm", "--url", "ftp://x/metrics"],
            "--url: url must be http",
            id="dcgm-bad-url",
        ),
        pytest.param(
            [
                "--source",
                "dcgm",
                "--url",
                "http://127.0.0.1:1/metrics",
                "--basic-auth-user",
                "ops",
                "--basic-auth-password-env",
                "NO_SUCH_VAR",
            ],
            "needs the password in $NO_SUCH_VAR",
            id="auth-without-password",
        ),
    ],
)
def test_collect_usage_errors_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    path = write_config(tmp_path / "c.yaml", a_config_dict())
    result = CliRunner().invoke(cli, ["collect", "--config", str(path), *args])
    assert result.exit_code == 2
    assert message in result.output
