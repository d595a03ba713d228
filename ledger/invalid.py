"""`Invalid`: a value refused, said as an English template with named fields, so that whoever
shows it to a person can say it in that person's language.

    raise Invalid("team {team!r} appears twice", team=name)

`str(exc)` is the English (`team 'vision' appears twice`), exactly what an f-string would have
said; `exc.say(translate)` looks the template up with `translate` (a catalog: the template is
the msgid) and fills in the same fields, whose values stay as they are. It is a `ValueError`,
so pydantic validators raise it like any other (pydantic keeps it in an error's
`ctx["error"]`: `tally.config_errors` says it in the CLI's language). The ledger itself knows
no language or catalog; `ledger.units.parse_micros` raises it, the configuration's validators
in `tally/` do.
"""

from __future__ import annotations

from collections.abc import Callable


class Invalid(ValueError):
    """A refused value: `template` (English, `str.format` fields) and its `fields`."""

    def __init__(self, template: str, **fields: object) -> None:
        self.template = template
        self.fields = fields
        super().__init__(template.format(**fields))

    def say(self, translate: Callable[[str], str]) -> str:
        """The message in `translate`'s language; a translation that cannot be filled in with
        these fields (a broken catalog entry) gives the English."""
        text = translate(self.template)
        try:
            return text.format(**self.fields)
        except (KeyError, IndexError, ValueError):
            return str(self)
