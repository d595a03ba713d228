"""The `budgets:` section: a team's budget either for one month (`period:`, a one-off grant of
the difference, `ledger.admin.BudgetGranted`) or renewed every month or quarter (`every:`, a
policy the ledger grants from, `ledger.admin.BudgetPolicySet`), in money, GPU-hours or both.

A recurring budget's `carry_over` says what a new allowance period takes of the previous
month's unspent remainder: `none` (the default), `all`, a percentage of the allowance
(`"25%"`), or a cap per unit (`{money: "500.00", gpu_hours: 100}`, naming every budgeted unit).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import field_validator, model_validator

from ledger.admin import CarryOver
from ledger.invalid import Invalid
from ledger.periods import Period
from ledger.units import Unit
from tally.config_fields import GpuMs, Micros, Name, Strict

_PERCENT = re.compile(r"^(\d{1,3})\s*%$")


class CarryCap(Strict):
    """At most this much of the remainder is carried over, per unit."""

    money: Micros | None = None
    gpu_hours: GpuMs | None = None

    @model_validator(mode="after")
    def _some_cap(self) -> CarryCap:
        if self.money is None and self.gpu_hours is None:
            raise Invalid("a carry-over cap needs money, gpu_hours, or both")
        if self.money is not None and self.money < 0:
            raise Invalid("a carry-over cap cannot be negative")
        return self


def _month(value: str | None) -> str | None:
    return None if value is None else Period.month(value).label


class BudgetConfig(Strict):
    """A team's budget: for one month (`period`) or every month or quarter (`every`)."""

    team: Name
    period: str | None = None
    every: Literal["month", "quarter"] | None = None
    money: Micros | None = None
    gpu_hours: GpuMs | None = None
    start: str | None = None
    end: str | None = None
    carry_over: str | CarryCap = "none"

    @field_validator("period", "start", "end")
    @classmethod
    def _months(cls, value: str | None) -> str | None:
        return _month(value)

    @field_validator("carry_over")
    @classmethod
    def _carry(cls, value: str | CarryCap) -> str | CarryCap:
        if isinstance(value, CarryCap) or value in ("none", "all"):
            return value
        match = _PERCENT.match(value)
        if match is None or int(match.group(1)) > 100:
            raise Invalid(
                'carry_over: none, all, a percentage such as "25%" (at most 100), or a cap '
                'such as {{money: "500.00"}}, not {value!r}',
                value=value,
            )
        return f"{int(match.group(1))}%"

    @model_validator(mode="after")
    def _some_amount(self) -> BudgetConfig:
        if self.money is None and self.gpu_hours is None:
            raise Invalid("a budget needs money, gpu_hours, or both")
        if self.money is not None and self.money < 0:
            raise Invalid("a budget cannot be negative")
        if (self.period is None) == (self.every is None):
            raise Invalid("a budget has either a period (one month) or every (month|quarter)")
        if self.period is not None and (self.start or self.end or self.carry_over != "none"):
            raise Invalid("start, end and carry_over belong to a recurring budget (every:)")
        if self.start and self.end and self.end < self.start:
            raise Invalid("end {end} is before start {start}", end=self.end, start=self.start)
        if isinstance(self.carry_over, CarryCap):
            for unit, amount, cap in (
                ("money", self.money, self.carry_over.money),
                ("gpu_hours", self.gpu_hours, self.carry_over.gpu_hours),
            ):
                if (amount is None) != (cap is None):
                    raise Invalid(
                        "carry_over: a cap names exactly the budgeted units ({unit})", unit=unit
                    )
        return self

    def carry(self, unit: Unit) -> tuple[CarryOver, int | None]:
        """The carry-over rule and its limit for one budgeted unit."""
        rule = self.carry_over
        if isinstance(rule, CarryCap):
            return CarryOver.AMOUNT, rule.money if unit is Unit.MONEY else rule.gpu_hours
        if rule.endswith("%"):
            return CarryOver.PERCENT, int(rule[:-1])
        return CarryOver(rule), None
