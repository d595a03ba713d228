"""One what-if: the window's history replayed under the baseline scenario (the recorded
configuration) and under the alternative, and everything `tally whatif` prints about them:
the report's own text (English, codes where a program reads them: `-o json|csv`, a saved
report) and `said`, the same in a reader's words for a table (`scheduler.whatif.texts`).

Pure but for the clock it reads to say how fast the replays ran.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ledger.read.texts import Translate
from ledger.read.whatif_words import metric_name, scope_name
from ledger.units import US_PER_SECOND
from scheduler.whatif.compare import (
    Divergence,
    capacity_sentence,
    comparison_rows,
    divergences,
    same_decisions,
    wait_flags,
)
from scheduler.whatif.history import History
from scheduler.whatif.metrics import Metrics, metrics
from scheduler.whatif.replay import Outcome, Progress, Scenario, replay

DAY_US = 86_400 * US_PER_SECOND


@dataclass(frozen=True, slots=True)
class WhatIfReport:
    since_us: int
    until_us: int
    jobs: int
    skipped: tuple[str, ...]
    baseline: Metrics
    alternative: Metrics
    rows: tuple[tuple[str, str, str, str], ...]
    divergences: tuple[Divergence, ...]  # the record against the baseline replay
    decisions_unchanged: bool  # the alternative admitted and preempted exactly as the baseline
    flags: tuple[str, ...]  # with GPUs added: teams whose p95 wait rose
    capacity: str | None  # with GPUs added: the capacity sentence
    replay_seconds: float  # wall-clock seconds of both replays
    undecodable: int = 0  # archived job messages that could not be read
    added_gpus: tuple[tuple[str, int], ...] = ()  # (model, count) the alternative was given

    @property
    def simulated_days_per_second(self) -> float:
        days = 2 * (self.until_us - self.since_us) / DAY_US
        return days / self.replay_seconds if self.replay_seconds > 0 else 0.0

    def said(self, tr: Translate) -> Said:
        """The comparison, divergences, flags and capacity sentence in `tr`'s words, written
        again from the figures (metric and scope names, waits, wait reasons in words)."""
        a, b = self.baseline, self.alternative
        added = dict(self.added_gpus)
        return Said(
            tuple(
                (metric_name(metric, tr), scope_name(scope, tr), x, y)
                for metric, scope, x, y in comparison_rows(a, b, tr)
            ),
            tuple(d.said(tr) for d in self.divergences),
            wait_flags(a, b, tr) if added else (),
            capacity_sentence(added, a, b, tr) if added else None,
        )


@dataclass(frozen=True, slots=True)
class Said:
    """A report as a table says it (`WhatIfReport.said`)."""

    rows: tuple[tuple[str, str, str, str], ...]  # metric, scope, baseline, alternative
    divergences: tuple[tuple[str, str, str, str], ...]  # job, recorded, replayed, cause
    flags: tuple[str, ...]
    capacity: str | None


def what_if(
    history: History,
    baseline: Scenario,
    alternative: Scenario,
    *,
    tolerance_us: int,
    added_gpus: Mapping[str, int] | None = None,
    progress: Progress | None = None,
) -> tuple[WhatIfReport, Outcome, Outcome]:
    """Replay `history` under both scenarios and compare them; also the two outcomes."""
    total = 2 * len(history.jobs)

    def second(done: int, _: int) -> None:
        if progress is not None:
            progress(len(history.jobs) + done, total)

    def first(done: int, _: int) -> None:
        if progress is not None:
            progress(done, total)

    a = replay(history, baseline, first)
    b = replay(history, alternative, second)
    ma, mb = metrics(a), metrics(b)
    added = dict(added_gpus or {})
    report = WhatIfReport(
        history.since_us,
        history.until_us,
        len(history.jobs),
        history.skipped,
        ma,
        mb,
        tuple(comparison_rows(ma, mb)),
        divergences(history.recorded, history.recorded_waits, a, tolerance_us),
        same_decisions(a, b),
        wait_flags(ma, mb) if added else (),
        capacity_sentence(added, ma, mb) if added else None,
        a.wall_s + b.wall_s,
        history.undecodable,
        tuple(sorted(added.items())),
    )
    return report, a, b
