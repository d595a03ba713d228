"""The dashboard's Simplified Chinese catalog covers every string the pages mark, and no page
hands Streamlit an unmarked English literal; numbers and dates are written per language.

Extraction is Babel's own (`babel.messages.extract`, the keywords `_`, `N_` and `tr`; in the read
models under `ledger/read/`, whose sentences the pages show, `tr` and `N_`), run over the source
as it is, so a newly marked string fails here until it is translated in
`dashboard/locale/zh_CN/LC_MESSAGES/dashboard.po`.
"""

from __future__ import annotations

import ast
import re
import string
from dataclasses import replace
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from babel.messages.extract import extract_from_dir
from babel.messages.pofile import read_po

from dashboard import i18n, portal_view, whatif_text
from dashboard.requests_view import change_shown
from ledger.read import job_history, rollups
from ledger.read.reports import IdleSharing
from ledger.read.statements import Budget, StatementLine, TeamStatement
from ledger.units import Unit
from tally.config import ConfigError, load_config
from tally.stack import ledger_env
from tests.builders import a_config_dict
from tests.conftest import REPO, write_config
from tests.unit.test_job_history import MIN, history

DASHBOARD = REPO / "dashboard"
KEYWORDS = {"_": None, "N_": None, "tr": None}  # tr: a `Translator` handed in
# Streamlit / Altair calls whose first argument or label keywords a person reads
SHOWN = {
    "title", "header", "subheader", "caption", "info", "warning", "success", "error",
    "metric", "radio", "selectbox", "download_button", "button", "expander", "markdown",
    "write", "text_input", "number_input", "multiselect", "checkbox", "toggle", "slider",
    "TextColumn", "NumberColumn", "DatetimeColumn", "ProgressColumn", "ListColumn",
    "form_submit_button", "text_area", "date_input", "select_slider", "Page",
}  # fmt: skip
SHOWN_KEYWORDS = {"help", "label", "title", "placeholder", "delta"}


# the sentences read models write for the pages, in the reader's language (`ledger.read.texts`)
READ_MODELS = REPO / "ledger" / "read"
READ_KEYWORDS = {"tr": None, "N_": None}


def extracted() -> dict[str, list[str]]:
    """msgid → where the source uses it (file:line): the pages' and the read models'."""
    found: dict[str, list[str]] = {}
    for directory, keywords in ((DASHBOARD, KEYWORDS), (READ_MODELS, READ_KEYWORDS)):
        for path, line, message, _comments, _context in extract_from_dir(
            str(directory), method_map=[("**.py", "python")], keywords=keywords
        ):
            assert isinstance(message, str), f"{path}:{line}: plural or empty message"
            found.setdefault(message, []).append(f"{directory.name}/{path}:{line}")
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
UNCHANGED = {"p50", "p95", "GPU", "FOCUS", "Tally", "XID", "GPU {gpu}"}  # the same in Chinese


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


# English words of the read models' sentences (identifiers and the scheduler's notes aside)
ENGLISH = re.compile(
    r"\b(the|because|since|has|been|was|waiting|for|and|its|running|finished|failed|"
    r"cancelled|stopped|submitted|given|asking|borrowed|expected|exit|attempt|team|ended|min)\b",
    re.IGNORECASE,
)


@pytest.mark.parametrize("job", ["job-a", "job-b", "job-c", "job-d", "job-e", "42"])
def test_a_jobs_explanation_speaks_the_pages_language(job: str) -> None:
    """Through the dashboard's catalog a job's explanation, advice and timeline are Chinese;
    without it (the CLI, every other caller) they are the English they always were."""
    events = history()
    teams = job_history.job_teams(job_history.fold_jobs(events))
    as_of = events[0].time_us + 100 * MIN
    zh = job_history.explain_job(job, events, as_of, teams, i18n.Translator(i18n.ZH_CN))
    en = job_history.explain_job(job, events, as_of, teams)
    assert en == job_history.explain_job(job, events, as_of, teams, i18n.Translator(i18n.EN))
    for said, english in zip(
        (zh.headline, zh.advice, *(t.text for t in zh.timeline)),
        (en.headline, en.advice, *(t.text for t in en.timeline)),
        strict=True,
    ):
        words = re.sub(r"`[^`]*`|vision uses 2 of 2|lent|UTC", "", said)
        assert not ENGLISH.search(words), said
        assert bool(re.search(CJK, said)) == bool(english), said


@pytest.mark.parametrize(
    ("us", "en", "zh"),
    [
        (5_000_000, "5 s", "5 秒"),
        (3 * 60 * MIN + 5 * MIN, "3 h 05 min", "3 小时 05 分"),
        (52 * 60 * MIN, "2 d 4 h", "2 天 4 小时"),
    ],
    ids=["seconds", "hours", "days"],
)
def test_durations_are_written_per_language(us: int, en: str, zh: str) -> None:
    assert job_history.duration_text(us) == en
    assert job_history.duration_text(us, i18n.Translator(i18n.ZH_CN)) == zh


def test_method_notes_speak_the_pages_language() -> None:
    zh = i18n.Translator(i18n.ZH_CN)
    notes = (
        rollups.usage_forecast_method(14, 1.5, 2.0, zh),
        rollups.forecast_method(7, zh),
        zh(rollups.SIZING_ASSUMPTIONS),
    )
    assert all(re.search(CJK, n) and not ENGLISH.search(n) for n in notes), notes
    assert rollups.usage_forecast_method(5, 7.2, 7.6).startswith(
        "Linear trend fitted by least squares to the last 5 complete days (+7.20 GPU-hours/day"
    )


WHATIF_ROWS = [
    (
        ["wait_p95", "team:vision", "3 h 06 min", "45 min"],
        ["p95 等待", "团队 vision", "3 小时 06 分", "45 分钟"],
    ),
    (
        ["jain_fairness", "teams", "0.912", "0.950"],
        ["Jain 公平性指数", "全部团队", "0.912", "0.950"],
    ),
    (["cost", "search", "12.00 USD", "9.00 USD"], ["成本", "search", "12.00 USD", "9.00 USD"]),
]


@pytest.mark.parametrize(("row", "shown"), WHATIF_ROWS, ids=["wait", "fairness", "cost"])
def test_a_saved_what_if_report_reads_in_chinese(row: list[str], shown: list[str]) -> None:
    zh, en = i18n.Translator(i18n.ZH_CN), i18n.Translator(i18n.EN)
    saved = dict(zip(("metric", "scope", "baseline", "alternative"), row, strict=True))
    assert whatif_text.row(saved, zh) == shown
    assert whatif_text.row(saved, en) == row  # the report's own words


def test_the_what_if_capacity_sentence_is_rebuilt_from_its_figures() -> None:
    doc = {
        "added_gpus": {"H100": 4},
        "wait_p95_us": [3 * 60 * MIN + 8 * MIN, 0],
        "capacity": "adding 4 GPUs of model H100 would cut p95 wait from 3 h 08 min to 0 s",
    }
    assert whatif_text.capacity(doc, i18n.Translator(i18n.EN)) == doc["capacity"]
    assert whatif_text.capacity(doc, i18n.Translator(i18n.ZH_CN)) == (
        "增加 4 块 H100 型号的 GPU 后，p95 等待将从 3 小时 08 分 缩短到 0 秒"
    )
    flag = "team vision: p95 wait rose from 10 min to 1 h 00 min"
    assert whatif_text.flag(flag, i18n.Translator(i18n.ZH_CN)) == (
        "团队 vision：p95 等待从 10 分钟 升至 1 小时 00 分"
    )


def test_a_statement_reads_in_chinese_and_stays_english_for_the_cli() -> None:
    line = StatementLine("detection", 7_200_000, 12_000_000, 3_600_000, 1_500_000)
    statement = TeamStatement(
        "vision", "2026-11", "USD", ("research",), 7_200_000, 12_000_000, 3_600_000, 1_500_000,
        250_000, 0, IdleSharing.WEIGHTED, 2_000_000, (line,), (replace(line, name="ada"),),
        (Budget(Unit.MONEY, 20_000_000, 12_000_000),),
    )  # fmt: skip
    english = statement.render_text()
    assert english.startswith("Statement for team vision, 2026-11 (USD)\nCost centre: research")
    assert re.search(r"PROJECT +GPU_HOURS +COST", english)
    zh = statement.render_text(i18n.Translator(i18n.ZH_CN))
    assert zh.startswith("团队 vision 对账单，2026-11（USD）\n成本中心：research")
    assert "按项目" in zh and "GPU_HOURS" not in zh
    assert not ENGLISH.search(re.sub(r"\b(vision|research|detection|ada)\b", "", zh)), zh


# ------------------------------------------------ the API's words on My jobs and Requests (#15)

ZH, EN_TR = i18n.Translator(i18n.ZH_CN), i18n.Translator(i18n.EN)


@pytest.mark.parametrize(
    ("state", "zh"),
    [("pending", "排队中"), ("running", "运行中"), ("cancelled", "已取消"), ("odd", "odd")],
    ids=["pending", "running", "cancelled", "unknown"],
)
def test_a_job_state_from_the_api_is_shown_translated(state: str, zh: str) -> None:
    assert portal_view.state_shown(state, ZH) == zh
    assert portal_view.state_shown(state, EN_TR) == state  # the API's own word


@pytest.mark.parametrize(
    ("reason", "zh"),
    [
        ("quota_exhausted", "团队配额已用满"),
        ("preempted: higher_priority", "被其他作业抢占，已回到队列"),
        ("a free-text reason", "a free-text reason"),
    ],
    ids=["code", "preempted", "free-text"],
)
def test_a_wait_reason_code_is_shown_in_words(reason: str, zh: str) -> None:
    assert portal_view.wait_shown(reason, ZH) == zh
    assert portal_view.wait_shown(reason, EN_TR) == reason


@pytest.mark.parametrize(
    ("change", "zh"),
    [
        (
            "quota train/H100 8 GPUs (borrowing unlimited, lending 2)",
            "配额 train/H100 8 块 GPU（借入上限 不限，借出上限 2）",
        ),
        ("budget 2026-12 gpu_ms +7200000", "预算 2026-12 +2 GPU-h"),
    ],
    ids=["quota", "budget"],
)
def test_a_requests_change_reads_in_chinese(change: str, zh: str) -> None:
    assert change_shown(change, None, ZH) == zh
    assert change_shown(change, None, EN_TR) == change_shown(change)


DIVERGENCES = [
    (
        {"job_id": "j1", "recorded": "+5 min on train/H100", "replayed": "not admitted",
         "cause": "the replay never admitted it (quota_exhausted)"},
        ["j1", "+5 分钟，在 train/H100", "未准入", "回放从未准入它（团队配额已用满）"],
    ),
    (
        {"job_id": "j2", "recorded": "+1 h 00 min on a/H100", "replayed": "+1 h 00 min on b/A100",
         "cause": "placed on b/A100 instead of a/H100"},
        ["j2", "+1 小时 00 分，在 a/H100", "+1 小时 00 分，在 b/A100",
         "被放在 b/A100，而不是 a/H100"],
    ),
    (
        {"job_id": "j3", "recorded": "+0 s on a/H100", "replayed": "+9 min on a/H100",
         "cause": "the replay kept it waiting (not yet considered)"},
        ["j3", "+0 秒，在 a/H100", "+9 分钟，在 a/H100", "回放中它仍在等待（尚未被调度）"],
    ),
    (
        {"job_id": "j4", "recorded": "not admitted", "replayed": "+0 s on a/H100",
         "cause": "never admitted in the record (tick_limit, then cohort_exhausted)"},
        ["j4", "未准入", "+0 秒，在 a/H100",
         "记录中从未被准入（大量作业正在启动，稍后轮到它，后来没有可借用的配额）"],
    ),
    (
        {"job_id": "j5", "recorded": "+0 s on a/H100", "replayed": "+2 s on a/H100",
         "cause": "the replay kept it waiting (cycle_limit)"},
        ["j5", "+0 秒，在 a/H100", "+2 秒，在 a/H100",
         "回放中它仍在等待（本轮调度的循环次数已用完）"],
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    ("saved", "shown"), DIVERGENCES, ids=["never", "placed", "waiting", "then", "cycle-limit"]
)
def test_a_what_if_divergence_reads_in_chinese(saved: dict[str, str], shown: list[str]) -> None:
    """The cause's wait reason is a code in the report: shown in words; English as saved."""
    assert whatif_text.divergence(saved, ZH) == shown
    assert whatif_text.divergence(saved, EN_TR) == list(saved.values())


def test_an_explanations_times_are_on_the_ledgers_clock() -> None:
    shanghai = ZoneInfo("Asia/Shanghai")
    events = history()
    as_of = events[0].time_us + 100 * MIN
    local = job_history.explain_job(
        "job-a", events, as_of, None, i18n.Translator(i18n.ZH_CN), shanghai
    )
    utc = job_history.explain_job("job-a", events, as_of)
    said = " ".join((local.headline, *(t.text for t in local.timeline)))
    assert "Asia/Shanghai" in said and "UTC" not in said
    assert "UTC" in " ".join((utc.headline, *(t.text for t in utc.timeline)))
    december = 1_796_054_400_000_000  # 2026-11-30T16:00:00Z: December's first instant there
    assert job_history.when_text(december, shanghai) == "2026-12-01 00:00 Asia/Shanghai"
    assert job_history.when_text(december) == "2026-11-30 16:00 UTC"
