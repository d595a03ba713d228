"""The `tally` CLI's language: English, or Simplified Chinese for people whose environment asks
for it, and the translations of what the CLI says to people.

The language: $TALLY_LANG if set, else the POSIX locale ($LC_ALL, $LC_MESSAGES, $LANG, the
first one set); a tag starting with `zh` (`zh_CN.UTF-8`, `zh-CN`) is Simplified Chinese, any
other English. Translated: the table headers of the human output (`-o table`), the messages
marked with `_()` (the errors that end a command and the lines on stderr, in `tally.cli`), and
every `--help` (`tally.cli.help`, when it is formatted).
Machine output (`-o json`, `-o csv`) never changes with the language: only `tally.output.table`
asks for headers. The catalog is `tally/locale/zh_CN/LC_MESSAGES/tally.po`, read with Babel on
first use (no compiled `.mo`; `babel.cfg` extracts its msgids); `tests/unit/test_cli_language.py`
fails on a marked message, a help text or a table header the catalog lacks.

The sentences the read models write (`ledger.read.texts`: a job's explanation, a team's
statement) have one translation, in the dashboard's catalog, which checks them
(`tests/unit/test_dashboard_i18n.py`); `reader` is the CLI's `Translate` for them: this catalog
first, then that one.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from functools import cache
from pathlib import Path

EN = "en"
ZH_CN = "zh-CN"
ENV = "TALLY_LANG"
CATALOG = Path(__file__).parent / "locale" / "zh_CN" / "LC_MESSAGES" / "tally.po"
# the read models' sentences (`reader`): translated once, in the dashboard's catalog
READ_CATALOG = Path(__file__).parents[1] / "dashboard/locale/zh_CN/LC_MESSAGES/dashboard.po"
_LOCALE_VARS = ("LC_ALL", "LC_MESSAGES", "LANG")


def language(env: Mapping[str, str] | None = None) -> str:
    """The CLI's language for environment `env` (default: this process's)."""
    env = os.environ if env is None else env
    asked = env.get(ENV) or next((env[v] for v in _LOCALE_VARS if env.get(v)), "")
    return ZH_CN if asked.strip().lower().startswith("zh") else EN


def _read(path: Path) -> dict[str, str]:
    from babel.messages.pofile import read_po

    with path.open("rb") as f:
        catalog = read_po(f)
    return {
        str(m.id): str(m.string)
        for m in catalog
        if isinstance(m.id, str) and m.id and m.string and not m.fuzzy
    }


@cache
def messages() -> dict[str, str]:
    """The Chinese catalog's translated, non-fuzzy messages."""
    return _read(CATALOG)


@cache
def read_model_messages() -> dict[str, str]:
    """The read models' sentences in Chinese (the dashboard's catalog), under the CLI's own."""
    return {**_read(READ_CATALOG), **messages()}


def translate(message: str, lang: str | None = None) -> str:
    """`message` in `lang` (default: the environment's); untranslated, as it is."""
    if (lang or language()) == EN:
        return message
    return messages().get(message, message)


def reader(lang: str | None = None) -> Callable[[str], str]:
    """The `ledger.read.texts.Translate` of `lang` (default: the environment's) for the
    sentences a read model writes (`tally report statement`, `tally job explain`)."""
    if (lang or language()) == EN:
        return _english
    table = read_model_messages()
    return lambda message: table.get(message, message)


def _english(message: str) -> str:
    return message


def _(message: str) -> str:
    """Marks a message for the catalog and translates it into the environment's language."""
    return translate(message)


def header(name: str, lang: str | None = None) -> str:
    """A table column's heading: `GPU_HOURS` in English, `GPU 小时` in Chinese."""
    lang = lang or language()
    return name.upper() if lang == EN else translate(name, lang)
