"""The scheduler service's interpreter settings while it serves (`scheduler.interpreter`): the
collector's thresholds, the frozen generation and the GIL's switch interval inside the block,
and exactly what they were before after it — on an exception too; objects frozen before stay
frozen."""

from __future__ import annotations

import gc
import sys

import pytest

from scheduler.interpreter import GC_YOUNG_ALLOCATIONS, serving_tuned


@pytest.fixture(autouse=True)
def _nothing_frozen():
    """Each test starts with nothing frozen (another test of this process may have frozen
    objects, e.g. a worker started in process); unfreezing only puts them back in the
    collector's passes."""
    gc.unfreeze()
    yield
    gc.unfreeze()


def _interpreter() -> tuple[tuple[int, ...], int, float]:
    return gc.get_threshold(), gc.get_freeze_count(), sys.getswitchinterval()


@pytest.mark.parametrize("interval_s", [0.0005, 0.0001, 0.002], ids=["default", "short", "long"])
def test_inside_the_block_the_interpreter_is_tuned_for_serving(interval_s):
    before = _interpreter()
    kept = [object() for _ in range(100)]  # alive now: frozen
    with serving_tuned(interval_s):
        thresholds, frozen, switch = _interpreter()
        assert thresholds == (GC_YOUNG_ALLOCATIONS, *before[0][1:])
        assert frozen >= before[1] + len(kept)
        assert switch == pytest.approx(interval_s)
    assert _interpreter() == before


def test_an_exception_in_the_block_leaves_the_interpreter_as_it_was():
    before = _interpreter()
    with pytest.raises(RuntimeError, match="tick failed"), serving_tuned(0.0001):
        raise RuntimeError("tick failed")
    assert _interpreter() == before


@pytest.mark.parametrize("interval_s", [0.0, -0.001], ids=["zero", "negative"])
def test_a_switch_interval_that_is_not_positive_is_refused_before_anything_changes(interval_s):
    before = _interpreter()
    with pytest.raises(ValueError, match="switch interval"), serving_tuned(interval_s):
        pass  # pragma: no cover - not reached
    assert _interpreter() == before


def test_objects_frozen_before_the_block_stay_frozen_after_it():
    gc.freeze()
    try:
        before = _interpreter()
        assert before[1] > 0
        with serving_tuned():
            pass
        thresholds, frozen, switch = _interpreter()
        assert (thresholds, switch) == (before[0], before[2])
        assert frozen > 0  # not unfrozen (the count itself drops as frozen objects are freed)
    finally:
        gc.unfreeze()
