"""Units of the ledger and the one place where decimal text becomes integer micro-units.

Invariants:
- time is UTC integer microseconds since the epoch (`*_us`);
- GPU time is integer GPU-milliseconds; money is integer micro-units of the ledger currency;
  energy is integer millijoules;
- no float ever becomes a ledger amount: prices arrive as decimal text and are converted
  exactly here, or rejected.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from enum import StrEnum

from ledger.invalid import Invalid

MICROS_PER_UNIT = 1_000_000
US_PER_MS = 1_000
US_PER_SECOND = 1_000_000
MS_PER_HOUR = 3_600_000
US_PER_HOUR = 3_600_000_000
SHARE_UNITS = 1000  # per-mille of one GPU: a GPU share of 250 is a quarter of it


class Unit(StrEnum):
    """A unit a posting amount is measured in. Transactions balance per unit."""

    GPU_MS = "gpu_ms"
    MONEY = "money_micros"
    ENERGY_MJ = "energy_mj"


def parse_micros(text: str | int | Decimal) -> int:
    """Return `text` (a decimal amount such as "2.50") as integer micro-units, exactly.

    Raises `Invalid` (a ValueError) for anything that is not a finite decimal with at most six
    places. Floats are refused: they cannot be converted without guessing.
    """
    if isinstance(text, bool):
        raise Invalid("a boolean is not an amount")
    if isinstance(text, float):
        raise Invalid("floats are not accepted as amounts; write the amount as text")
    try:
        value = Decimal(text) if not isinstance(text, Decimal) else text
    except (InvalidOperation, ValueError) as exc:
        raise Invalid("{text!r} is not a decimal amount", text=text) from exc
    if not value.is_finite():
        raise Invalid("{text!r} is not a finite amount", text=text)
    try:
        micros = value * MICROS_PER_UNIT
    except ArithmeticError:  # decimal.Overflow: beyond the decimal context's exponent
        raise Invalid("too large an amount") from None
    if micros != micros.to_integral_value():
        raise Invalid("{text!r} has more than six decimal places", text=text)
    return int(micros)


def format_micros(micros: int, places: int = 2) -> str:
    """Render integer micro-units as a decimal string rounded half-even to `places`."""
    value = Decimal(micros) / MICROS_PER_UNIT
    return f"{value.quantize(Decimal(1).scaleb(-places)):f}"


def divide_round_half_even(numerator: int, denominator: int) -> int:
    """Integer division rounded half to even; the one rounding rule of the ledger."""
    if denominator <= 0:
        raise ValueError("denominator must be positive")
    quotient, remainder = divmod(numerator, denominator)
    twice = 2 * remainder
    if twice > denominator or (twice == denominator and quotient % 2 == 1):
        quotient += 1
    return quotient
