"""The benchmark harness's `policy_figures`, shared by the scheduler benchmarks: each spec's
figure for Tally beside every baseline policy measured in the same run, the note once."""

from __future__ import annotations

import pytest

from tests.benchmarks.harness import FigureSpec, policy_figures

RESULTS = {
    "FIFO": {"rate": 100.0, "p95": 30.0},
    "request share (Kueue-like)": {"rate": 200.0, "p95": 20.0},
    "Tally": {"rate": 400.0, "p95": 10.0},
}
SPECS: tuple[FigureSpec, ...] = (
    ("rate", "decisions/s", "decisions/s", True, "≥ 1,000 decisions/s", "saturated cycles"),
    ("p95", "queueing delay p95", "s", False, None, None),
)


@pytest.mark.parametrize(
    ("index", "name", "value", "baseline", "ratio", "note"),
    [
        (0, "decisions/s (Tally vs FIFO)", 400.0, "FIFO", 4.0, "saturated cycles"),
        (1, "decisions/s (Tally vs request)", 400.0, "request share (Kueue-like)", 2.0, None),
        (2, "queueing delay p95 (Tally vs FIFO)", 10.0, "FIFO", 1 / 3, None),
        (3, "queueing delay p95 (Tally vs request)", 10.0, "request share (Kueue-like)", 0.5, None),
    ],
    ids=["rate-vs-fifo", "rate-vs-kueue", "p95-vs-fifo", "p95-vs-kueue"],
)
def test_each_spec_gives_tally_beside_each_baseline(index, name, value, baseline, ratio, note):
    figures = policy_figures("scheduler", RESULTS, SPECS)
    assert len(figures) == len(SPECS) * 2  # Tally is never its own baseline
    figure = figures[index]
    assert (figure.bench, figure.name, figure.value) == ("scheduler", name, value)
    assert figure.baseline_name == baseline and figure.ratio == pytest.approx(ratio)
    assert figure.note == note
    assert figure.higher_is_better is SPECS[index // 2][3]
    assert figure.target == SPECS[index // 2][4]
