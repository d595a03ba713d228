"""The service's ticks: a submit is decided at the next tick at once, never a whole cycle
interval later — also when its publish ends while a tick is still publishing its own events."""

from __future__ import annotations

import asyncio

import pytest

from ledger.job_events import JobAdmitted
from tests.unit.test_scheduler_service_support import Rig

LONG_INTERVAL_S = 3600.0  # a lost wake-up would leave the job waiting this long


def _admitted(rig: Rig) -> set[str]:
    return {e.job_id for e in rig.events() if isinstance(e, JobAdmitted)}


@pytest.mark.parametrize(
    "during_tick",
    [False, True],
    ids=["submitted-between-ticks", "published-while-a-tick-publishes"],
)
def test_a_submit_wakes_the_next_tick_at_once(tmp_path, during_tick):
    rig = Rig(tmp_path)
    service = rig.service
    service.cycle_interval_s = LONG_INTERVAL_S
    late: list[str] = []
    decide = service.decide

    async def decide_then_submit():  # the submit lands after this tick's decisions were made
        events = await decide()
        if during_tick and not late:
            late.append((await rig.submit(queue="train")).job_id)
        return events

    service.decide = decide_then_submit  # type: ignore[method-assign]

    async def go() -> None:
        runner = asyncio.create_task(service.run())
        try:
            await asyncio.sleep(0.05)  # the first tick has run and the service waits
            if not during_tick:
                late.append((await rig.submit(queue="train")).job_id)
            async with asyncio.timeout(5):
                while not late or late[0] not in _admitted(rig):
                    await asyncio.sleep(0.01)
        finally:
            await service.stop(stop_jobs=False)
            await runner

    asyncio.run(go())
    assert late and late[0] in _admitted(rig)
