"""The dashboard's Simplified Chinese catalog covers every string the pages mark, and no page
hands Streamlit an unmarked English literal; numbers and dates are written per language.

Extraction is Babel's own (`babel.messages.extract`, the keywords `_` and `N_`), run over the
source as it is, so a newly marked string fails here until it is translated in
`dashboard/locale/zh_CN/LC_MESSAGES/dashboard.po`.
"""

from __future__ import annotations

import ast
import re
import string
from pathlib import Path

import pytest
from babel.messages.extract import extract_from_dir
from babel.messages.pofile import read_po

from dashboard import i18n
from tally.config import ConfigError, load_config
from tally.stack import ledger_env
from tests.builders import a_config_dict
from tests.conftest import REPO, write_config

DASHBOARD = REPO / "dashboard"
KEYWORDS = {"_": None, "N_": None}
# Streamlit / Altair calls whose first argument or label keywords a person reads
SHOWN = {
    "title", "header", "subheader", "caption", "info", "warning", "success", "error",
    "metric", "radio", "selectbox", "download_button", "button", "expander", "markdown",
    "write", "text_input", "number_input", "multiselect", "checkbox", "toggle", "slider",
    "TextColumn", "NumberColumn", "DatetimeColumn", "ProgressColumn", "ListColumn",
    "form_submit_button", "text_area", "date_input", "select_slider", "Page",
}  # fmt: skip
SHOWN_KEYWORDS = {"help", "label", "title", "placeholder", "delta"}


def extracted() -> dict[str, list[str]]:
    """msgid → where the source uses it (file:line)."""
    found: dict[str, list[str]] = {}
    for path, line, message, _comments, _context in extract_from_dir(
        str(DASHBOARD), method_map=[("**.py", "python")], keywords=KEYWORDS
    ):
        assert isinstance(message, str), f"{path}:{line}: plural or empty message"
        found.setdefault(message, []).append(f"{path}:{line}")
    return found


def catalog() -> dict[str, tuple[str, bool]]:
    with i18n.catalog_path(i18n.ZH_CN).open("rb") as f:
        return {str(m.id): (str(m.string or ""), m.fuzzy) for m in read_po(f) if m.id}


def fields(text: str) -> set[str]:
    return {name for _t, name, _f, _c in string.Formatter().parse(text) if name is not None}


def test_the_source_marks_messages() -> None:
    assert len(extracted()) > 300


def test_every_marked_message_has_a_chinese_translation() -> None:
    zh = catalog()
    missing = {m: where[0] for m, where in extracted().items() if m not in zh}
    assert not missing, f"msgids missing from the zh-CN catalog: {missing}"
    empty = [m for m, (text, fuzzy) in zh.items() if not text.strip() or fuzzy]
    assert not empty, f"untranslated or fuzzy in zh-CN: {empty}"


def test_translations_keep_the_placeholders() -> None:
    wrong = {
        m: text
        for m, (text, _f) in catalog().items()
        if fields(m) != fields(text) or m.count("`") != text.count("`")
    }
    assert not wrong, wrong


def test_translations_are_chinese() -> None:
    latin_only = [
        m
        for m, (text, _f) in catalog().items()
        if re.search(r"[A-Za-z]{3}", re.sub(r"\{\w+\}", "", m)) and not re.search(CJK, text)
        and m not in UNCHANGED
    ]  # fmt: skip
    assert not latin_only, latin_only


LATIN = "[A-Za-z]{2}"
CJK = "[\u4e00-\u9fff]"
UNCHANGED = {"p50", "p95", "GPU", "FOCUS", "Tally", "XID"}  # the same in Chinese


def _shown_literals(path: Path) -> list[str]:
    """`file:line` of every English literal handed straight to a call a person reads."""

    def english(node: ast.expr) -> bool:
        if isinstance(node, ast.Constant):
            text = node.value
            if not isinstance(text, str) or text in UNCHANGED or re.search(CJK, text):
                return False  # a brand, or already bilingual (the language switch's label)
            return re.search(LATIN, text) is not None
        if isinstance(node, ast.JoinedStr):
            return any(english(v) for v in node.values)
        if isinstance(node, ast.BinOp):
            return english(node.left) or english(node.right)
        if isinstance(node, ast.IfExp):
            return english(node.body) or english(node.orelse)
        return False

    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr not in SHOWN:
            continue
        shown = [*node.args[:1], *(k.value for k in node.keywords if k.arg in SHOWN_KEYWORDS)]
        config = [k.value for k in node.keywords if k.arg == "column_config"]
        for c in config:
            if isinstance(c, ast.Dict):
                shown += c.values  # type: ignore[arg-type]
        found += [f"{path.name}:{n.lineno}" for n in shown if n is not None and english(n)]
    return found


@pytest.mark.parametrize(
    "path", sorted(DASHBOARD.glob("*.py")), ids=lambda p: p.name.removesuffix(".py")
)
def test_no_page_shows_an_unmarked_english_literal(path: Path) -> None:
    assert _shown_literals(path) == []


@pytest.mark.parametrize(
    ("lang", "value", "places", "text"),
    [
        (i18n.EN, 1234567, 0, "1,234,567"),
        (i18n.ZH_CN, 1234567, 0, "1,234,567"),
        (i18n.EN, 1234.5, 1, "1,234.5"),
        (i18n.ZH_CN, 0.25, 2, "0.25"),
    ],
    ids=["en-int", "zh-int", "en-1dp", "zh-2dp"],
)
def test_numbers_are_grouped_per_language(lang: str, value: float, places: int, text: str) -> None:
    assert i18n.number(value, places, lang) == text


@pytest.mark.parametrize(
    ("lang", "text"),
    [(i18n.EN, "2026-11-03 09:05 UTC"), (i18n.ZH_CN, "2026年11月3日 09:05 UTC")],
    ids=["en", "zh-CN"],
)
def test_dates_are_written_per_language(lang: str, text: str) -> None:
    assert i18n.date_time(1_793_696_700_000_000, lang) == text


@pytest.mark.parametrize(
    ("asked", "lang"),
    [("zh-CN", i18n.ZH_CN), ("zh_Hans", i18n.ZH_CN), ("en-GB", i18n.EN), (None, i18n.EN)],
    ids=["zh-CN", "zh_Hans", "en-GB", "none"],
)
def test_requested_languages_resolve(asked: str | None, lang: str) -> None:
    assert i18n.resolve(asked) == lang


@pytest.mark.parametrize(
    ("language", "env"),
    [("zh-CN", {i18n.LANGUAGE_ENV: "zh-CN"}), ("en", {i18n.LANGUAGE_ENV: "en"}), (None, {})],
    ids=["zh-CN", "en", "unset"],
)
def test_the_configured_language_reaches_the_dashboard(
    tmp_path: Path, language: str | None, env: dict[str, str]
) -> None:
    data = a_config_dict()
    if language is not None:
        data["dashboard"] = {"language": language}
    path = write_config(tmp_path / "tally.yaml", data)
    handed = ledger_env(load_config(path), path)
    assert {k: v for k, v in handed.items() if k == i18n.LANGUAGE_ENV} == env


def test_an_unknown_language_is_a_config_error(tmp_path: Path) -> None:
    path = write_config(tmp_path / "tally.yaml", a_config_dict(dashboard={"language": "fr"}))
    with pytest.raises(ConfigError, match="language"):
        load_config(path)
