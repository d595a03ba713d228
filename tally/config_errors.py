"""What an operator reads when a configuration file is invalid: pydantic's validation errors as
one line each, `FILE: field.path: what is wrong`, in the CLI's language (`tally.language`).

The field path and the values quoted stay as they are. pydantic's own sentences are translated
by their English message template (`PydanticKnownError(type, ctx).message_template`, the
catalog's msgid, e.g. `Input should be greater than {gt}`), then filled with the error's context;
a custom error type (`path_type`, a union's own message) by its message. `PYDANTIC_TYPES` are the
types translated: every type the configuration's models can raise
(`tests/unit/test_config_language.py` walks their schema and checks each one's template is in
the catalog); any other keeps pydantic's English. The sentences of Tally's own validators
(`Value error, …`) are `ledger.invalid.Invalid`s: an English template and its fields, said
through the catalog here (`Invalid.say`), so validation itself knows no language; a plain
`ValueError` stays English.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError
from pydantic_core import PydanticKnownError

from ledger.excerpts import bounded
from ledger.invalid import Invalid
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
    "int_parsing_size",
    "string_unicode",
    "string_too_short",
    "string_too_long",
    "tuple_type",
    "too_short",
    "too_long",
    "path_type",
)
# words pydantic puts into a sentence (`too_short`'s `{field_type}`), said in the language too
CONTEXT_WORDS = ("field_type",)
# `literal_error`'s and `enum`'s choices, `'a', 'b' or 'c'`: the last one after " or " (quoted,
# or a bare number), said as `{choices} or {last}` in the language
CHOICES = ("literal_error", "enum")
LAST_CHOICE = re.compile(r"(.+) or ('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|[^'\" ]+)", re.DOTALL)
# a placeholder pydantic fills itself (`item{expected_plural}`): nothing in a translation
PLURAL = "expected_plural"


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


_PRIVATE_MODULE = re.compile(r"<class '([\w.]+?)\._\w+\.(\w+)'>")


def public_names(message: str) -> str:
    """`message` with a class named by its public module (`<class 'pathlib.Path'>`, which
    Python 3.13 writes `<class 'pathlib._local.Path'>`): one sentence, and one msgid, on every
    Python."""
    return _PRIVATE_MODULE.sub(r"<class '\1.\2'>", message)


def error_message(err: Any) -> str:
    """One pydantic error's sentence in the CLI's language (a plain `ValueError`'s: as written)."""
    english = public_names(str(err["msg"]).removeprefix("Value error, "))
    if err["type"] == "value_error":
        problem = (err.get("ctx") or {}).get("error")
        return problem.say(translate) if isinstance(problem, Invalid) else english
    if err["type"] not in PYDANTIC_TYPES:
        return english
    # a whole float as pydantic writes it (`greater than 0`, not `0.0`)
    context = {
        k: int(v) if isinstance(v, float) and v.is_integer() else v
        for k, v in (err.get("ctx") or {}).items()
    }
    try:
        template = PydanticKnownError(err["type"], context or None).message_template
    except (TypeError, KeyError, ValueError):  # a custom type (its message is the msgid), or
        return translate(english)  # a context this pydantic no longer gives
    said = translate(template)
    if said == template:
        return english
    context.setdefault(PLURAL, "")  # filled by pydantic in English; Chinese has no plural
    choices = LAST_CHOICE.fullmatch(str(context.get("expected", "")))
    if err["type"] in CHOICES and choices:
        context["expected"] = translate("{choices} or {last}").format(
            choices=choices[1], last=choices[2]
        )
    for word in CONTEXT_WORDS:
        value = context.get(word)
        if isinstance(value, str):
            context[word] = translate(value)
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
