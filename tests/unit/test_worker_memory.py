"""The worker process's memory (`streams.worker_memory`): a worker built in a fresh process
converts the ledger's rows with the system allocator and without importing pandas, leaves the
published store's modules unloaded when it does not publish, and pyarrow's explicit pandas
calls still work there afterwards (one child process, whose findings each test reads); the
store's calls run on one thread of their own."""

from __future__ import annotations

import asyncio
import contextvars
import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from ledger.errors import StoreError
from streams.worker_memory import StoreThread
from tests.conftest import child_env

CHILD = """
import json, sys
from pathlib import Path
from ledger.pricing import PriceBook
from ledger.store.port import ConsumedMessage
from ledger.store.schema import archive_to_arrow
from streams.worker import LedgerWorker, WorkerSettings

found = {"pandas_at_import": "pandas" in sys.modules}
worker = LedgerWorker(WorkerSettings(
    bootstrap=("127.0.0.1:1",), group_id="g", samples_topic="s", deadletter_topic="d",
    alerts_topic="a", data_dir=Path(sys.argv[1]), prices=PriceBook(()), cost_centres={},
))
# what a commit converts: the batch's messages, Python lists into Arrow columns
rows = archive_to_arrow([ConsumedMessage("s", 0, 7, b"{}", b"k")], "inc", 1, None).num_rows
import pyarrow as pa
found.update(
    rows=rows,
    pandas=sorted(m for m in sys.modules if m == "pandas" or m.startswith("pandas.")),
    pool=pa.default_memory_pool().backend_name,
    published=[m for m in ("ledger.store.published", "ledger.store.snapshot") if m in sys.modules],
)
import pandas as pd  # loaded on purpose: pyarrow's explicit pandas calls work as before
frame = pd.DataFrame({"n": [1, 2], "s": ["x", "y"]})
table = pa.Table.from_pandas(frame, preserve_index=False)
found.update(
    from_pandas=table.to_pydict(),
    to_pandas=table.to_pandas()["s"].tolist(),
    table_of_frame=pa.table(frame).num_rows,
)
worker.store.close()
print(json.dumps(found))
"""


@pytest.fixture(scope="module")
def found(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    data_dir: Path = tmp_path_factory.mktemp("worker-memory")
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(data_dir)],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def test_rows_converted_without_importing_pandas(found: dict[str, Any]) -> None:
    assert found["pandas_at_import"] is False
    assert found["rows"] == 1
    assert found["pandas"] == []


def test_arrow_allocates_from_the_system_allocator(found: dict[str, Any]) -> None:
    assert found["pool"] == "system"


def test_published_store_not_loaded_without_a_publisher(found: dict[str, Any]) -> None:
    assert found["published"] == []


def test_explicit_pandas_calls_still_work(found: dict[str, Any]) -> None:
    assert found["from_pandas"] == {"n": [1, 2], "s": ["x", "y"]}
    assert found["to_pandas"] == ["x", "y"]
    assert found["table_of_frame"] == 2


def test_store_calls_run_on_one_thread_of_their_own_in_the_callers_context() -> None:
    seen = contextvars.ContextVar("seen", default="unset")

    def where(tag: str) -> tuple[str, str, str]:
        return threading.current_thread().name, tag, seen.get()

    def fails() -> None:
        raise StoreError("refused")

    async def main() -> list[tuple[str, str, str]]:
        seen.set("caller's")
        thread = StoreThread()
        try:
            ran = [await thread.run(where, str(i)) for i in range(3)]
            ran += await asyncio.gather(*(thread.run(where, tag="gathered") for _ in range(3)))
            with pytest.raises(StoreError, match="refused"):
                await thread.run(fails)
            return ran
        finally:
            thread.close()

    ran = asyncio.run(main())
    names = {name for name, _, _ in ran}
    assert len(names) == 1 and names.pop().startswith("ledger-store")
    assert [tag for _, tag, _ in ran] == ["0", "1", "2", "gathered", "gathered", "gathered"]
    assert {value for _, _, value in ran} == {"caller's"}
