"""The scheduler service's interpreter settings while it serves (`serving_tuned`): the cyclic
garbage collector's and the GIL's.

- **The collector.** What the jobs topic's replay built lives as long as the service, so it is
  frozen out of the collector's passes, and the youngest generation is collected every
  `GC_YOUNG_ALLOCATIONS` allocations (Python's default: 700): a tick and a burst of submits
  allocate tens of thousands of short-lived objects, and each default pass cascaded into scans
  of every job's record and history (measured: a third of the scheduler's own CPU per job).
- **The GIL's switch interval.** The event loop (the API, decisions, publishing) gives the GIL
  up at every socket read and write; the executor's start threads hold it while they prepare a
  process. A thread that wants the GIL back waits up to the switch interval (Python's default:
  5 ms) before the holder is asked to drop it, so under a burst of starts each of the loop's
  many small system calls could wait that long — a convoy that made the API the bottleneck.
  Measured with the end-to-end bench (1,000 submits/s offered by 100 clients, two cores): at
  5 ms the API took ~900/s (API p50 70 ms, p99 submit→start 0.58 s, the machine 83 % busy);
  at 0.5 ms all 1,000/s (API p50 31–53 ms, p99 submit→start 0.15–0.30 s), for about the same
  CPU per job.

Invariant: on leaving `serving_tuned` (normally or by an exception) the collector's thresholds
and the switch interval are what they were before it, and so is the frozen generation when it
was empty before (`gc.unfreeze` cannot tell objects frozen by others from ours: those stay
frozen, which only spares them the collector's passes).
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from streams.collector_pause import freeze_startup_objects

GC_YOUNG_ALLOCATIONS = 50_000
DEFAULT_SWITCH_INTERVAL_S = 0.0005


@contextmanager
def serving_tuned(switch_interval_s: float = DEFAULT_SWITCH_INTERVAL_S) -> Iterator[None]:
    """Freeze what is alive now, collect the youngest generation less often and switch the
    GIL every `switch_interval_s` for the block; as before after it."""
    if not switch_interval_s > 0:
        raise ValueError(f"the GIL's switch interval must be positive, not {switch_interval_s}")
    thresholds = gc.get_threshold()
    switch = sys.getswitchinterval()
    frozen_before = gc.get_freeze_count()
    freeze_startup_objects()
    try:
        gc.set_threshold(GC_YOUNG_ALLOCATIONS, *thresholds[1:])
        sys.setswitchinterval(switch_interval_s)
        yield
    finally:
        sys.setswitchinterval(switch)
        gc.set_threshold(*thresholds)
        if not frozen_before:
            gc.unfreeze()
