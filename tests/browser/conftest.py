"""Fixtures for the dashboard in a real browser: a seeded ledger, `streamlit run` on a free
port, and headless Chromium from Debian driven by Playwright.

Registers the `browser` marker. The tests are skipped only when `/usr/bin/chromium` is missing
(`apt-get install -y chromium`); Playwright's Python package must be installed
(`pip install playwright` — never `playwright install`, which downloads a browser).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.conftest import REPO, child_env
from tests.unit.test_dashboard_seed import seed_ledger
from tests.whatif_builders import saved_whatif

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
START_TIMEOUT_S = 60


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "browser: drives the dashboard in headless Chromium (needs /usr/bin/chromium)"
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def seeded_ledger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ledger = seed_ledger(tmp_path_factory.mktemp("browser") / "ledger")
    saved_whatif(ledger, tmp_path_factory.mktemp("whatif"))  # for the What-if page
    return ledger


@contextmanager
def serving_dashboard(
    log_dir: Path, env: dict[str, str], port: int, command: list[str] | None = None
) -> Iterator[str]:
    """The dashboard on loopback `port` — `command` (default: `streamlit run dashboard/app.py`)
    with `env` — and its URL once healthy. Skips without Chromium."""
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing: apt-get install -y chromium")
    command = command or [
        sys.executable, "-m", "streamlit", "run", str(REPO / "dashboard" / "app.py"),
        "--server.address", "127.0.0.1", "--server.port", str(port),
        "--server.headless", "true", "--browser.gatherUsageStats", "false",
        "--server.fileWatcherType", "none",
    ]  # fmt: skip
    log_path = log_dir / "streamlit.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            command, cwd=REPO, env=child_env(**env), stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"streamlit exited with {proc.returncode}:\n{log_path.read_text()}")
            try:
                if requests.get(f"{url}/_stcore/health", timeout=2).ok:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                pytest.fail(
                    f"streamlit did not start in {START_TIMEOUT_S}s:\n{log_path.read_text()}"
                )
            time.sleep(0.2)
        yield url
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


@pytest.fixture(scope="session")
def dashboard_url(seeded_ledger: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`streamlit run dashboard/app.py` on a free loopback port over the seeded ledger."""
    env = {"TALLY_DATA_DIR": str(seeded_ledger), "TALLY_CURRENCY": "USD"}
    with serving_dashboard(tmp_path_factory.mktemp("streamlit"), env, free_port()) as url:
        yield url


@contextmanager
def launch_chromium() -> Iterator[Any]:
    """Headless Chromium (Debian's) under Playwright."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail(
            "Playwright's Python package is missing: pip install playwright "
            "(do not run `playwright install`; the tests use /usr/bin/chromium)"
        )
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture(scope="module")  # sync Playwright runs a loop: end it with the module
def chromium(dashboard_url: str) -> Iterator[Any]:
    """Headless Chromium over the seeded dashboard; the first page load is warmed."""
    with launch_chromium() as browser:
        page = browser.new_page()
        page.goto(dashboard_url, wait_until="networkidle")  # the first load can be blank
        page.wait_for_timeout(1000)
        page.close()
        yield browser
