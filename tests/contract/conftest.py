"""Fixtures shared by the contract suites: `store`, the ledger store port's two
implementations — the DuckDB store (`duckdb`) and the in-memory one (`memory`) — for the store
contract (`test_store_contract.py`, `test_store_sealing_contract.py`) and the audit and request
store contracts. A suite of another port defines its own `store`, which wins in its module."""

from __future__ import annotations

import pytest

from ledger.store.hot import DuckDBStore
from ledger.store.memory import MemoryStore


@pytest.fixture(params=["duckdb", "memory"])
def store(request, tmp_path):
    s = DuckDBStore(tmp_path / "ledger") if request.param == "duckdb" else MemoryStore()
    yield s
    s.close()
