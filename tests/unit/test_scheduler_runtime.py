"""The interpreter settings the scheduler service runs under (`scheduler.service.tuned_runtime`):
set while it runs, undone after, however it ends."""

from __future__ import annotations

import gc
import sys

import pytest

from scheduler.service import GC_YOUNG_ALLOCATIONS, GIL_SWITCH_INTERVAL_S, tuned_runtime


class Stopped(Exception):
    pass


@pytest.mark.parametrize("fails", [False, True], ids=["stops-cleanly", "fails"])
def test_the_service_runtime_is_tuned_while_it_runs_and_as_before_after(fails):
    before = (gc.get_threshold(), sys.getswitchinterval(), gc.get_freeze_count())
    assert before[0][0] != GC_YOUNG_ALLOCATIONS and before[1] != GIL_SWITCH_INTERVAL_S
    try:
        with tuned_runtime():
            assert gc.get_threshold() == (GC_YOUNG_ALLOCATIONS, *before[0][1:])
            assert sys.getswitchinterval() == pytest.approx(GIL_SWITCH_INTERVAL_S)
            assert gc.get_freeze_count() > 0  # what was alive before is frozen
            if fails:
                raise Stopped
    except Stopped:
        assert fails
    assert (gc.get_threshold(), sys.getswitchinterval(), gc.get_freeze_count()) == before
