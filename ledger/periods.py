"""Accounting periods: calendar months in UTC, named `YYYY-MM`.

A posting belongs to the period in which its interval starts. `Period` is a half-open range
`[start_us, end_us)`.
"""

from __future__ import annotations

import calendar
from dataclasses import dataclass
from datetime import UTC, datetime


@dataclass(frozen=True, slots=True)
class Period:
    """A half-open time range `[start_us, end_us)`; `label` is how a person wrote it."""

    label: str
    start_us: int
    end_us: int

    @classmethod
    def month(cls, text: str) -> Period:
        """`2026-11` → November 2026 in UTC; raises ValueError for anything else."""
        try:
            year_text, month_text = text.split("-")
            if len(year_text) != 4 or len(month_text) != 2:
                raise ValueError(text)
            year, month = int(year_text), int(month_text)
            start = datetime(year, month, 1, tzinfo=UTC)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{text!r} is not a month such as 2026-11") from exc
        days = calendar.monthrange(year, month)[1]
        start_s = int(start.timestamp())
        return cls(text, start_s * 1_000_000, (start_s + days * 86_400) * 1_000_000)

    @classmethod
    def containing(cls, time_us: int) -> Period:
        moment = datetime.fromtimestamp(time_us // 1_000_000, tz=UTC)
        return cls.month(f"{moment.year:04d}-{moment.month:02d}")

    def next(self) -> Period:
        return Period.containing(self.end_us)


def period_label(time_us: int) -> str:
    """The `YYYY-MM` label of the month containing `time_us` (UTC)."""
    moment = datetime.fromtimestamp(time_us // 1_000_000, tz=UTC)
    return f"{moment.year:04d}-{moment.month:02d}"
