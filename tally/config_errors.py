"""What an operator reads when a configuration file is invalid: pydantic's validation errors as
one line each, `FILE: field.path: what is wrong`, in the CLI's language (`tally.language`).

The field path and the values quoted stay as they are. pydantic's own sentences are translated
by their English message template (`PydanticKnownError(type, ctx).message_template`, the
catalog's msgid, e.g. `Input should be greater than {gt}`), then filled with the error's context;
a type the catalog does not have keeps pydantic's English. The sentences of Tally's own
validators (`Value error, …`) are free text written where they are raised, and stay English.
`PYDANTIC_TYPES` are the error types translated; `tests/unit/test_cli_language.py` checks that
each one's template is in the catalog.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from pydantic_core import PydanticKnownError

from ledger.excerpts import bounded
from tally.language import _, translate

# the pydantic error types a configuration file meets, whose sentence the catalog translates
PYDANTIC_TYPES = (
    "missing",
    "extra_forbidden",
    "int_type",
    "int_parsing",
    "int_from_float",
    "float_type",
    "float_parsing",
    "string_type",
    "bool_type",
    "bool_parsing",
    "dict_type",
    "list_type",
    "model_type",
    "model_attributes_type",
    "greater_than",
    "greater_than_equal",
    "less_than",
    "less_than_equal",
    "literal_error",
    "enum",
    "string_pattern_mismatch",
    "decimal_parsing",
    "decimal_type",
    "multiple_of",
)


def location(loc: tuple[int | str, ...]) -> str:
    """A field's path as the file writes it: `scheduler.queues[0].name`."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part.startswith("function-") or part.startswith("function_"):
            continue
        else:
            out += f".{part}" if out else str(part)
    return out or _("(top level)")


def error_message(err: Any) -> str:
    """One pydantic error's sentence in the CLI's language (a validator's own: as written)."""
    english = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] not in PYDANTIC_TYPES:
        return english
    # a whole float as pydantic writes it (`greater than 0`, not `0.0`)
    context = {
        k: int(v) if isinstance(v, float) and v.is_integer() else v
        for k, v in (err.get("ctx") or {}).items()
    }
    try:
        template = PydanticKnownError(err["type"], context or None).message_template
    except (TypeError, KeyError, ValueError):  # a context this pydantic no longer gives
        return english
    said = translate(template)
    if said == template:
        return english
    try:
        return said.format(**context)
    except (KeyError, IndexError, ValueError):
        return english


def format_validation_error(source: str, exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        # bounded: a message may quote the value, and a value may be a 1 MiB string
        message = bounded(error_message(err), 512)
        lines.append(f"{source}: {location(tuple(err['loc']))}: {message}")
    return "\n".join(lines)
