"""Fixtures several unit-test modules share: the dashboard's seeded ledger, seeded once per
test process (`seed_ledger` takes a second or two) for the modules that copy it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.test_dashboard_seed import seed_ledger


@pytest.fixture(scope="session")
def seeded_once(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The seeded ledger (`tests.unit.test_dashboard_seed`), never to be changed: copy it."""
    return seed_ledger(tmp_path_factory.mktemp("seeded-once") / "ledger")
