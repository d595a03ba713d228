"""The language of the sentences read models compose for people (a job's explanation, a
forecast's method, durations): English unless the reader hands in a translation.

A read model that writes text takes a `Translate` — an English msgid to the reader's language,
`english` by default, so the CLI and every existing caller read what they always did — and
passes each msgid through it where the text is written: `tr("… {name} …").format(name=…)`,
named placeholders filled after translation. A table of texts translated where it is used marks
its entries with `N_`. The ledger knows no catalog: the dashboard hands in its own
(`dashboard.i18n.Translator`), whose test extracts these msgids from `ledger/read/` (keywords
`tr` and `N_`) beside the pages' own.
"""

from __future__ import annotations

from collections.abc import Callable

Translate = Callable[[str], str]


def english(message: str) -> str:
    """The source language: every msgid as it is."""
    return message


def N_(message: str) -> str:
    """Marks `message` for extraction; it is translated with the reader's `tr` where shown."""
    return message
