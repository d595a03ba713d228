"""Readers' DuckDB connections (`ledger.read.queries.reader_connection`): one in-memory database
per process, a connection of its own per reader, what one registers unseen by another."""

from __future__ import annotations

import os

import duckdb
import pyarrow as pa
import pytest

from ledger.read import queries
from ledger.read.queries import reader_connection


def _file_cache(con: duckdb.DuckDBPyConnection) -> object:
    return con.execute("SELECT current_setting('enable_external_file_cache')").fetchone()


def test_readers_share_the_processs_database_but_not_what_they_register() -> None:
    first, second = reader_connection(), reader_connection()
    try:
        assert first is not second
        first.register("mine", pa.table({"x": [1, 2]}))
        assert first.execute("SELECT sum(x) FROM mine").fetchone() == (3,)
        with pytest.raises(duckdb.CatalogException):
            second.execute("SELECT * FROM mine")
        assert _file_cache(second) == (False,)  # no file data cached between queries
        assert len(queries._READERS) == 1
    finally:
        first.close()
        second.close()
    third = reader_connection()  # closing a reader's connection leaves the database open
    try:
        assert third.execute("SELECT 42").fetchone() == (42,)
    finally:
        third.close()


def test_a_forked_child_opens_a_database_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    reader_connection().close()
    (parent,) = queries._READERS.values()
    monkeypatch.setattr(os, "getpid", lambda: -1)  # what a forked child sees: another pid
    child = reader_connection()
    try:
        assert list(queries._READERS) == [-1]
        assert queries._READERS[-1] is not parent
    finally:
        child.close()
        queries._READERS.clear()  # the next reader, back in this process, opens another
