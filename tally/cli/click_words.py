"""click's own messages in the CLI's language: "No such option", "Missing argument", "Try 'tally
-h' for help.", "Error:", a bad value's reason — everything click says to an operator itself.

click marks these with the standard library's `gettext` (`from gettext import gettext as _`,
`ngettext`, the default domain `messages`), which finds translations only in compiled `.mo`
files chosen by the POSIX locale, not $TALLY_LANG. `install` points each click module's `_` and
`ngettext` at `gettext`/`ngettext` here instead: they look the English msgid up in Tally's own
catalog (`tally.language`) when the message is written, so the language is $TALLY_LANG's (or
the locale's) at run time, and in English every message is click's, unchanged. Both forms of a
plural are plain msgids of the catalog (Chinese has one form). Only names click imported from
`gettext` are rebound, so a click that stops using gettext is left alone;
`tests/unit/test_cli_language.py` checks that every click module that uses gettext speaks
through here and that the catalog has each of click's msgids (Babel's extraction of click).
"""

from __future__ import annotations

import gettext as stdlib_gettext
import sys

from tally.language import translate

CLICK_MODULES = (
    "click.core",
    "click.decorators",
    "click.exceptions",
    "click.formatting",
    "click.parser",
    "click.shell_completion",
    "click.termui",
    "click.types",
    "click._termui_impl",
)


def gettext(message: str) -> str:
    """click's `_`: `message` in the CLI's language."""
    return translate(message)


def ngettext(singular: str, plural: str, n: int) -> str:
    """click's `ngettext`: the English form for `n`, in the CLI's language."""
    return translate(singular if n == 1 else plural)


def install() -> None:
    """Points click's modules at this catalog (idempotent; each module imported first)."""
    import importlib

    for name in CLICK_MODULES:
        try:
            module = sys.modules.get(name) or importlib.import_module(name)
        except ImportError:  # a module a later click no longer has
            continue
        names = vars(module)
        if names.get("_") is stdlib_gettext.gettext:
            names["_"] = gettext
        if names.get("ngettext") is stdlib_gettext.ngettext:
            names["ngettext"] = ngettext
