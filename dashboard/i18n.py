"""The dashboard's languages: which one a session shows, its message catalog, and how numbers
and dates are written in it.

English is the source language (the msgids in the code); Simplified Chinese comes from the
gettext catalog `dashboard/locale/zh_CN/LC_MESSAGES/dashboard.po`, read with Babel when first
needed (there is no compiled `.mo` to go stale: the `.po` is the only copy). A page marks a
human-facing string with `_()` (or `N_()` where it is defined before a session's language is
known, then translates it with `_()` where shown); placeholders are named (`{team}`) and filled
with `str.format` after translation. `tests/unit/test_dashboard_i18n.py` fails on any msgid the
source uses that the catalog lacks or leaves untranslated.

The session's language: the sidebar's switch; before it is touched, `?lang=` in the URL, then
$TALLY_DASHBOARD_LANGUAGE (the configuration's `dashboard.language`), then the browser's
language, then English.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import UTC, tzinfo
from decimal import Decimal
from functools import cache
from pathlib import Path

import streamlit as st
from babel.messages.pofile import read_po
from babel.numbers import format_decimal

from ledger.periods import local_time, zone_name

EN = "en"
ZH_CN = "zh-CN"
LANGUAGES = {EN: "English", ZH_CN: "简体中文"}
LANGUAGE_ENV = "TALLY_DASHBOARD_LANGUAGE"
LOCALE_DIR = Path(__file__).parent / "locale"
DOMAIN = "dashboard"
_BABEL_LOCALE = {EN: "en_US", ZH_CN: "zh_Hans_CN"}
_KEY = "language"


def N_(message: str) -> str:
    """Marks `message` for extraction without translating it (translate it where shown)."""
    return message


def catalog_path(language: str) -> Path:
    return LOCALE_DIR / language.replace("-", "_") / "LC_MESSAGES" / f"{DOMAIN}.po"


@cache
def messages(language: str) -> dict[str, str]:
    """The translated, non-fuzzy messages of `language` (empty for English)."""
    path = catalog_path(language)
    if language == EN or not path.exists():
        return {}
    with path.open("rb") as f:
        catalog = read_po(f)
    return {
        str(m.id): str(m.string)
        for m in catalog
        if m.id and isinstance(m.id, str) and m.string and not m.fuzzy
    }


def resolve(requested: str | None) -> str:
    """The supported language for a requested tag (`zh`, `zh-CN`, `zh_Hans`…; else English)."""
    tag = (requested or "").strip().replace("_", "-").lower()
    return ZH_CN if tag.startswith("zh") else EN


def default_language() -> str:
    """The language before the switch is touched: URL, configuration, browser, English."""
    asked = st.query_params.get("lang") or os.environ.get(LANGUAGE_ENV) or st.context.locale
    return resolve(asked)


def language() -> str:
    """This session's language."""
    value = st.session_state.get(_KEY)
    return value if value in LANGUAGES else default_language()


def _(message: str) -> str:
    """`message` in this session's language."""
    return messages(language()).get(message, message)


@dataclass(frozen=True, slots=True)
class Translator:
    """`_` of one language as a value: what the dashboard hands a read model that writes
    sentences (`ledger.read.texts.Translate`), and a cached query's argument (the language is
    part of the cache key)."""

    language: str

    def __call__(self, message: str) -> str:
        return messages(self.language).get(message, message)


def translator() -> Translator:
    """This session's language, for the read models (`ledger.read.texts`)."""
    return Translator(language())


def start() -> None:
    """Fixes this session's language before anything is written (the switch keeps it)."""
    if _KEY not in st.session_state:
        st.session_state[_KEY] = default_language()


def switch() -> str:
    """The language switch (at the end of the sidebar, under the filters); the chosen language.
    It takes effect from the next run, which Streamlit starts at once when it changes."""
    start()
    with st.sidebar:
        chosen = st.selectbox(
            "Language · 语言", list(LANGUAGES), format_func=LANGUAGES.__getitem__, key=_KEY
        )
    return str(chosen)


def number(value: float | int | Decimal, places: int = 0, lang: str | None = None) -> str:
    """`value` with the locale's grouping and `places` decimals (display only)."""
    pattern = "#,##0" + ("." + "0" * places if places else "")
    locale = _BABEL_LOCALE[lang or language()]
    return format_decimal(value, format=pattern, locale=locale, decimal_quantization=True)


def date_time(time_us: int, lang: str | None = None, zone: tzinfo = UTC) -> str:
    """An instant to the minute on `zone`'s clock, named: `2026-11-30 14:05 UTC`,
    `2026年11月30日 22:05 Asia/Shanghai`."""
    t = local_time(time_us, zone)
    name = zone_name(zone)
    if (lang or language()) == ZH_CN:
        return f"{t.year}年{t.month}月{t.day}日 {t:%H:%M} {name}"
    return f"{t:%Y-%m-%d %H:%M} {name}"
