"""`tally worker` against a real tansu broker, on a data directory with no ledger: its job is to
create one, and it says so; `TALLY_LOG_LEVEL=debug` reaches Tally's loggers and Faust's alike, in
the one log format every long-running command shares."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

import pytest

from ledger.store.layout import has_ledger
from tests.conftest import child_env, tally_command
from tests.integration.support import load, pipeline_config

pytestmark = pytest.mark.broker

# "<date> <time>,<ms> worker <LEVEL> <logger>: <message>" (tally.cli.logs.LOG_FORMAT)
LINE = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} worker (DEBUG|INFO|WARNING|ERROR) (\S+): "
)


def test_the_worker_creates_a_missing_ledger_and_says_so(broker, tmp_path):
    config, path = load(tmp_path, pipeline_config(tmp_path, nodes=1, partitions=1))
    data_dir = config.ledger.data_dir
    assert not data_dir.exists()
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            tally_command("worker", "--config", str(path), "--bootstrap", broker.bootstrap),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=child_env(TALLY_LOG_LEVEL="DEBUG"),  # case-insensitive, from the environment
            start_new_session=True,
        )
    expected = {"tally", "aiokafka", "faust", "mode"}
    try:
        deadline = time.monotonic() + 45
        while time.monotonic() < deadline and proc.poll() is None:
            text = log.read_text(errors="replace")
            if has_ledger(data_dir) and expected <= loggers_in(text):
                break  # Faust's worker (faust and mode) is up, logging through Tally's format
            time.sleep(0.3)
        text = log.read_text(errors="replace")
        assert proc.poll() is None, text[-3000:]
        assert has_ledger(data_dir), text[-3000:]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
    assert not re.search(r"^\[\d{4}-", text, re.M), text[-3000:]  # no line in Faust's format
    said = [line for line in text.splitlines() if "creating a new one" in line]
    assert said == [line for line in said if LINE.match(line)] and len(said) == 1, text[-3000:]
    assert f"no ledger at {data_dir} yet: creating a new one" in said[0]
    assert expected <= loggers_in(text), sorted(loggers_in(text))
    assert re.search(r"^\S+ \S+ worker DEBUG (faust|mode)\.", text, re.M), text[-3000:]


def loggers_in(text: str) -> set[str]:
    """The top-level names of the loggers that wrote a line in Tally's format."""
    return {m.group(2).split(".")[0] for m in map(LINE.match, text.splitlines()) if m}
