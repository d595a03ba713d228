"""The worker process's own memory, beside the writer's DuckDB limit (`ledger.store.hot_memory`):
which allocator Arrow uses, pyarrow's look for pandas, and the one thread the store's calls
run on.

- Arrow's allocator. pyarrow's default pool is mimalloc, which keeps what a batch's Arrow tables
  freed in caches of the thread that freed it (the commits run in the default executor's
  threads) rather than giving it back: on the ingest bench's real-time data the worker held
  ~30 MiB more at its peak than with the system allocator, at the same speed. `use_system_pool`
  makes the system allocator pyarrow's default pool for the process.
- pandas. The first time pyarrow converts a Python list it imports pandas, ~300 modules and
  ~33 MiB, to ask whether the list is a pandas object; the worker never hands it one.
  `spare_pandas` lets that first look find pandas absent (pyarrow looks once per process), so
  its implicit checks (`pa.array`, `pa.table`) answer "not pandas" without importing it, while
  its explicit pandas calls (`Table.to_pandas`, `Table.from_pandas`) still import it when made.
  Nothing changes in a process that has loaded pandas already.

Both are process-wide and change no result: they are called when a worker is built
(`LedgerWorker`), never at import.

- One store thread. Every thread that allocates gets arenas of its own from the C allocator and
  from DuckDB's, and memory freed in one is not reused by another; `asyncio.to_thread` hands
  calls to whichever of the loop's executor threads is free. `StoreThread` runs the worker's
  store calls (ingest, outbox, seal) on one thread of their own: they already take turns under
  the worker's lock, so nothing runs in another order. On the bench's real-time data the
  worker's peak was ~15 MiB lower.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from types import ModuleType
from typing import ParamSpec, TypeVar

import pyarrow as pa

P = ParamSpec("P")
R = TypeVar("R")


def use_system_pool() -> None:
    """Make the system allocator pyarrow's default memory pool (see the module docstring)."""
    pa.set_memory_pool(pa.system_memory_pool())


class _Absent(importlib.abc.MetaPathFinder):
    """Finds no `pandas` while pyarrow takes its one look."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == "pandas":
            raise ModuleNotFoundError("pandas is not loaded in the ledger worker", name=fullname)
        return None


def spare_pandas() -> None:
    """Let pyarrow's one look for pandas find it absent, unless it is loaded already (see the
    module docstring)."""
    if "pandas" in sys.modules:
        return
    absent = _Absent()
    sys.meta_path.insert(0, absent)
    try:
        pa.array([0])  # a list: pyarrow asks whether it is a pandas object, once
    finally:
        sys.meta_path.remove(absent)


def spare_memory() -> None:
    """Both of the above, as a worker is built."""
    use_system_pool()
    spare_pandas()


class StoreThread:
    """Runs calls on one thread of their own, started at the first (see the module
    docstring)."""

    def __init__(self, name: str = "ledger-store") -> None:
        self._name = name
        self._executor: ThreadPoolExecutor | None = None

    async def run(self, func: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        """`func(*args, **kwargs)` on the thread, in the caller's context, as
        `asyncio.to_thread` runs it."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix=self._name)
        call = functools.partial(contextvars.copy_context().run, func, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    def close(self) -> None:
        """Let the thread end once its call (if any) returns."""
        if self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = None
