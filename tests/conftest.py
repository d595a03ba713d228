"""Shared fixtures: a real tansu broker on a free port, temporary ledger directories."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from streams.kafka import ensure_topics
from tally.broker import EmbeddedBroker
from tests.s3_server import s3_bucket, s3_server, s3_store  # noqa: F401  (fixtures, by import)

REPO = Path(__file__).resolve().parent.parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Slow tests first (a stable sort: otherwise collection order). `make test` spreads the
    suite's files over worker processes (pytest-xdist, `--dist loadfile`) in this order, so
    the minutes-long campaigns start at once, side by side, instead of one of them last."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """A long-running command run in this process (CliRunner) configures logging
    (`tally.cli.logs`): put the root and `tally` loggers back as they were after each test."""
    root, tally = logging.getLogger(), logging.getLogger("tally")
    saved = (root.handlers[:], root.level, tally.handlers[:], tally.level, tally.propagate)
    try:
        yield
    finally:
        root.handlers[:], root.level = saved[0], saved[1]
        tally.handlers[:], tally.level, tally.propagate = saved[2], saved[3], saved[4]


@pytest.fixture
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    """A fresh tansu broker (memory storage) for one test; stopped afterwards."""
    log = tmp_path_factory.mktemp("broker") / "broker.log"
    instance = EmbeddedBroker(log_path=log).start()
    try:
        yield instance
    finally:
        instance.stop()


def create_topics(bootstrap: str, names: list[str], partitions: int = 4) -> None:
    asyncio.run(ensure_topics(bootstrap, names, partitions))


def write_config(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def tally_command(*args: str) -> list[str]:
    """argv that runs the `tally` CLI of this checkout in a child process."""
    return [sys.executable, "-m", "tally", *args]


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env
