"""The worker's collector pause restores the collector's state, whatever happens inside."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest

from streams.collector_pause import collector_paused


@pytest.fixture
def collector_state() -> Iterator[None]:
    was = gc.isenabled()
    yield
    if was:
        gc.enable()
    else:
        gc.disable()


@pytest.mark.parametrize("enabled_before", [True, False], ids=["enabled", "disabled"])
def test_a_pause_restores_the_state_it_found(collector_state, enabled_before):
    (gc.enable if enabled_before else gc.disable)()
    with collector_paused():
        assert not gc.isenabled()
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer pause still holds
    assert gc.isenabled() is enabled_before


def test_an_exception_inside_a_pause_restores_the_collector(collector_state):
    gc.enable()
    with pytest.raises(RuntimeError), collector_paused():
        raise RuntimeError("a batch failed")
    assert gc.isenabled()


def test_overlapping_pauses_from_threads_enable_the_collector_once_both_end(collector_state):
    gc.enable()
    inside, release = threading.Event(), threading.Event()

    def other() -> None:
        with collector_paused():
            inside.set()
            release.wait(5)

    thread = threading.Thread(target=other)
    thread.start()
    assert inside.wait(5)
    with collector_paused():
        pass
    assert not gc.isenabled()  # the other thread's pause is still open
    release.set()
    thread.join(5)
    assert gc.isenabled()
