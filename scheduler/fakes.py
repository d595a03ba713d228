"""In-memory fakes of the service's ports, for tests and a service run without a broker (the
executor's and the clock's are in `scheduler.executors.fake`).

`MemoryPublisher` keeps every message it acknowledged, in order, all in partition 0 at offsets
0, 1, 2, …; `fail_next` makes that many next calls raise `BrokerUnavailable` and keep nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

from ledger.holds import HoldEvent
from ledger.job_events import JobEvent
from scheduler.errors import BrokerUnavailable
from scheduler.jobs_topic import Outgoing


class MemoryPublisher:
    """Keeps what it is given (tests, and a service run without a broker)."""

    def __init__(self, partitions: int = 1) -> None:
        self.messages: list[Outgoing] = []
        self.partitions = partitions
        self.fail_next = 0

    async def publish(self, messages: Sequence[Outgoing]) -> list[tuple[int, int]]:
        if self.fail_next:
            self.fail_next -= 1
            raise BrokerUnavailable("the test broker is down")
        out = []
        for m in messages:
            out.append((0, len(self.messages)))
            self.messages.append(m)
        return out

    def events(self) -> list[JobEvent | HoldEvent]:
        return [m.event for m in self.messages]
