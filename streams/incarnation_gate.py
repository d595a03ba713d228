"""The broker-incarnation check of one batch: asked as the batch goes to the store thread,
answered while it folds, awaited by its commit.

A batch fetched from a broker other than the one the ingestor stands for must not be applied
(`refuses`; why: `LedgerWorker._guard_incarnation`). Asking the broker is a round trip (a
metadata request, ~1.5–2 ms per batch against the embedded broker on a loaded 2-core machine),
which the worker used to wait for before folding. An `IncarnationGate` sends the same question
at the same point (the batch fetched, nothing of it folded or committed) and lets the fold run
meanwhile; the ingest calls `confirm` (on the store thread) before each commit of the batch,
which waits for the answer and raises `IncarnationChanged` when it refuses, so no commit of the
batch happens. The worker awaits `verdict` once the batch returns (or fails), so a refused
batch that committed nothing (all of it applied before) still ends the worker as before, and
closes the gate when done with the batch (`close`: a batch abandoned midway, its call cancelled,
leaves no commit waiting on the store thread).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable

ANSWER_WAIT_S = 30.0  # the question's own timeouts are seconds: past this, something is wrong


def refuses(applied: str, current: str | None) -> bool:
    """Whether a batch is refused: the broker now answers with another cluster id than the
    incarnation the ingestor applies (`applied`). None, the broker not reached, refuses
    nothing: the messages in hand were fetched from the broker known before."""
    return current is not None and current != applied


class IncarnationChanged(Exception):
    """The broker answered as another incarnation: the batch must not be committed."""

    def __init__(self, current: str, applied: str) -> None:
        super().__init__(f"the broker is now {current}, not {applied}")
        self.current = current
        self.applied = applied


class IncarnationGate:
    """One batch's question to the broker (`ask`, started at once on the running loop) and
    its answer, for the store thread (`confirm`) and the loop (`verdict`)."""

    def __init__(self, applied: str, ask: Awaitable[str | None]) -> None:
        self.applied = applied
        self._answered = threading.Event()
        self._current: str | None = None
        self._failure: BaseException | None = None
        self._task: asyncio.Future[str | None] = asyncio.ensure_future(ask)
        self._task.add_done_callback(self._answer)

    def _answer(self, task: asyncio.Future[str | None]) -> None:
        if task.cancelled():
            self._failure = asyncio.CancelledError()
        elif (failure := task.exception()) is not None:
            self._failure = failure
        else:
            self._current = task.result()
        self._answered.set()

    def confirm(self) -> None:
        """Block until the broker answered; raise `IncarnationChanged` when the answer refuses
        the batch, or an error when the question failed (the batch is not committed then
        either). Called on the store thread, never on the loop that answers it."""
        if not self._answered.wait(ANSWER_WAIT_S):
            raise TimeoutError(f"the broker's cluster id not known after {ANSWER_WAIT_S:.0f} s")
        if self._failure is not None:
            raise RuntimeError("asking the broker for its cluster id failed") from self._failure
        if refuses(self.applied, self._current):
            assert self._current is not None
            raise IncarnationChanged(self._current, self.applied)

    def close(self) -> None:
        """The batch is done with (or abandoned: cancelled, failed): a commit still waiting
        for the answer waits no more, and is refused."""
        if not self._answered.is_set():
            self._failure = asyncio.CancelledError()
            self._answered.set()
        self._task.cancel()

    async def verdict(self) -> IncarnationChanged | None:
        """On the loop, once the batch is done with: the refusal, if the answer refuses it
        (a failed question raises here as it did before the check ran beside the fold)."""
        current = await self._task
        if refuses(self.applied, current):
            assert current is not None
            return IncarnationChanged(current, self.applied)
        return None
