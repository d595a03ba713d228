"""The scheduler e2e benchmark's steady rate: accepted submits answered per second away from the
load's edges, counted from the answers' times alone."""

from __future__ import annotations

import pytest

from tests.benchmarks.bench_scheduler_e2e import steady_rate


@pytest.mark.parametrize(
    ("answered_at", "since", "until", "expected"),
    [
        ([1.0, 1.5, 2.0, 2.5, 3.0], 1.0, 3.0, 2.0),
        ([0.2, 0.9, 1.1, 1.9, 9.5, 9.9], 1.0, 9.0, 0.25),
        ([5.0] * 10, 1.0, 9.0, 1.25),
        ([], 1.0, 9.0, 0.0),
        ([2.0], 3.0, 3.0, 0.0),
        ([2.0, 4.0], 3.0, 1.0, 0.0),
    ],
    ids=[
        "since-counted-until-not",
        "edges-left-out",
        "bunched-answers",
        "no-answers",
        "empty-window",
        "inverted-window",
    ],
)
def test_steady_rate(answered_at: list[float], since: float, until: float, expected: float) -> None:
    assert steady_rate(answered_at, since, until) == pytest.approx(expected)
