"""Field types the configuration models share: names (`Name`), amounts of money (`Micros`) and
the `Strict` base model (unknown keys are errors, values are frozen).

Kept apart from `tally.config` so that section models in their own modules
(`tally.alerts_config`) use the same rules without importing the whole configuration.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict

from ledger.admin import MAX_AMOUNT
from ledger.units import parse_micros

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def _money(value: Any) -> int:
    if isinstance(value, float):
        value = Decimal(repr(value))  # YAML `2.5`: its shortest repr is the text that was written
    if isinstance(value, int | str | Decimal) and not isinstance(value, bool):
        micros = parse_micros(value)
        if abs(micros) > MAX_AMOUNT:  # the ledger books no amount beyond this
            raise ValueError(f"at most {MAX_AMOUNT // 1_000_000:,} in magnitude")
        return micros
    raise ValueError('expected a decimal amount such as "2.50"')


Micros = Annotated[int, BeforeValidator(_money)]


def _name(value: Any) -> str:
    if not isinstance(value, str) or not NAME.match(value):
        raise ValueError(
            "names use letters, digits, '.', '_' and '-', start with a letter or digit, "
            "and are at most 64 characters"
        )
    return value


Name = Annotated[str, BeforeValidator(_name)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
