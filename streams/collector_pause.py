"""The worker's garbage-collection policy: a batch is applied with Python's cyclic garbage
collector paused, and what the process built at startup is frozen out of its passes.

A batch decodes tens of thousands of small objects (envelopes, samples, rows) that all live until
its commit. Each allocation burst triggers the collector's generational passes, which scan those
survivors again and again: measured on a 57,600-sample batch, half of the decode time. Applying a
batch creates no reference cycles that must be reclaimed while it runs — reference counting frees
its objects when it ends — so the collector waits until the batch is done, then runs as usual.

Invariant: the collector's enabled state after a pause is what it was before (nesting and
concurrent pauses from threads included); an exception inside a pause does not change that.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class _Pauses:
    """The open pauses of this process and the collector's state before the first."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.open = 0
        self.was_enabled = False

    def enter(self) -> None:
        with self.lock:
            if self.open == 0:
                self.was_enabled = gc.isenabled()
                gc.disable()
            self.open += 1

    def leave(self) -> None:
        with self.lock:
            self.open -= 1
            if self.open == 0 and self.was_enabled:
                gc.enable()


_PAUSES = _Pauses()


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cyclic collector for the block (re-entrant, thread-safe)."""
    _PAUSES.enter()
    try:
        yield
    finally:
        _PAUSES.leave()


def freeze_startup_objects() -> None:
    """Move every object alive now (modules, the app, configuration) to the permanent
    generation: the collector's full passes no longer scan them."""
    gc.collect()
    gc.freeze()
