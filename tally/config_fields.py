"""Field types the configuration models share: names (`Name`), amounts of money (`Micros`),
environment variable names (`EnvName`) and the secrets they hold (`secret_from_env`), the
GPU-hours (`GpuMs`), the
`Strict` base model (unknown keys are errors, values are frozen) and `ConfigError`.

Secrets never sit in the configuration file: a secret field has an `*_env` twin naming the
environment variable that holds it, read when the secret is used (not when the file is
loaded, so commands that do not use a secret do not need it). A variable that is named but
not set is a `ConfigError` naming the field and the variable.

Kept apart from `tally.config` so that section models in their own modules
(`tally.alerts_config`) use the same rules without importing the whole configuration.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict

from ledger.admin import MAX_AMOUNT
from ledger.invalid import Invalid
from ledger.units import MS_PER_HOUR, parse_micros
from tally.language import _

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


class ConfigError(Exception):
    """A configuration file that cannot be read or is invalid; the message says where and why."""


def _money(value: Any) -> int:
    if isinstance(value, float):
        value = Decimal(repr(value))  # YAML `2.5`: its shortest repr is the text that was written
    if isinstance(value, int | str | Decimal) and not isinstance(value, bool):
        micros = parse_micros(value)
        if abs(micros) > MAX_AMOUNT:  # the ledger books no amount beyond this
            raise Invalid("at most {limit:,} in magnitude", limit=MAX_AMOUNT // 1_000_000)
        return micros
    raise Invalid('expected a decimal amount such as "2.50"')


Micros = Annotated[int, BeforeValidator(_money)]


def _name(value: Any) -> str:
    if not isinstance(value, str) or not NAME.match(value):
        raise Invalid(
            "names use letters, digits, '.', '_' and '-', start with a letter or digit, "
            "and are at most 64 characters"
        )
    return value


Name = Annotated[str, BeforeValidator(_name)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _env_name(value: Any) -> str:
    if not isinstance(value, str) or not ENV_NAME.match(value):
        raise Invalid("an environment variable name: letters, digits and '_'")
    return value


EnvName = Annotated[str, BeforeValidator(_env_name)]


def secret_from_env(field: str, variable: str, environ: Mapping[str, str] | None = None) -> str:
    """The value of `variable`, the secret of config field `field`; `ConfigError` naming both
    when it is not set or empty."""
    value = (os.environ if environ is None else environ).get(variable)
    if not value:
        raise ConfigError(
            _("{field}: environment variable {variable} is not set").format(
                field=field, variable=variable
            )
        )
    return value


def _gpu_hours(value: Any) -> int:
    """GPU-hours as decimal text (or a YAML number) → integer GPU-milliseconds, exactly."""
    if isinstance(value, bool) or not isinstance(value, int | float | str | Decimal):
        raise Invalid('expected GPU-hours such as 500 or "12.5"')
    if isinstance(value, float):
        value = Decimal(repr(value))
    try:
        hours = Decimal(value)
    except ArithmeticError:
        raise Invalid("{value!r} is not a number of GPU-hours", value=value) from None
    if not hours.is_finite() or hours < 0:
        raise Invalid("GPU-hours must be a finite, non-negative number")
    try:
        ms = hours * MS_PER_HOUR
    except ArithmeticError:  # decimal.Overflow: beyond the decimal context's exponent
        raise Invalid("at most {limit:,} GPU-hours", limit=MAX_AMOUNT // MS_PER_HOUR) from None
    if ms != ms.to_integral_value():
        raise Invalid("{value} GPU-hours is not a whole number of GPU-milliseconds", value=value)
    if ms > MAX_AMOUNT:  # the ledger books no amount beyond this
        raise Invalid("at most {limit:,} GPU-hours", limit=MAX_AMOUNT // MS_PER_HOUR)
    return int(ms)


GpuMs = Annotated[int, BeforeValidator(_gpu_hours)]
