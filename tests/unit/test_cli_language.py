"""The `tally` CLI in Simplified Chinese: the language from $TALLY_LANG or the POSIX locale, a
Chinese catalog entry for every marked message, every table header the commands print and every
`--help` text of every command (the click command tree walked), `babel.cfg`'s extraction finding
every help text, table headings translated and aligned, JSON and CSV the same in every language,
and an error that ends a command said in Chinese with its exit code unchanged."""

from __future__ import annotations

import ast
import importlib
import re
import string
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, tzinfo
from functools import cache
from pathlib import Path
from zoneinfo import ZoneInfo

import click
import orjson
import pytest
from babel.messages.extract import extract_from_dir, extract_from_file
from babel.messages.frontend import parse_mapping_cfg
from babel.util import pathmatch
from click.testing import CliRunner

import tally.cli
from ledger.job_events import encode_job_event
from ledger.read.job_history import when_text
from ledger.read.reports import IdleSharing
from ledger.read.statements import Budget, StatementLine, TeamStatement
from ledger.units import Unit
from scheduler.whatif import COLUMNS as WHATIF_COLUMNS
from streams.kafka import BrokerError
from tally import language
from tally.broker import INSTALL_EMBEDDED
from tally.cli import click_words, options
from tally.cli.explain_text import explanation_text
from tally.cli.help import Command, help_text
from tally.config import ConfigError, load_config
from tally.output import OutputFormat, render, shown_time
from tests.builders import a_config_dict
from tests.conftest import REPO, write_config
from tests.unit.test_job_history import MIN, history

TALLY = REPO / "tally"
# names whose list or tuple value is a table's headers (`headers`, `HEADERS`, `JOB_COLUMNS`, …)
HEADER_NAMES = re.compile(r"headers|columns|detail", re.IGNORECASE)
DIMENSIONS = ("cost_centre", "team", "project", "user")  # `tally report cost --by`


def header_literals() -> dict[str, str]:
    """Every string literal in a table header list under tally/ → where (file:line)."""
    found: dict[str, str] = {}
    for path in sorted(TALLY.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            values: list[ast.expr] = []
            if isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                named = any(isinstance(t, ast.Name) and HEADER_NAMES.search(t.id) for t in targets)
                if named and node.value is not None:
                    values.append(node.value)
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "render":
                values += node.args[:1]
            for value in values:
                if isinstance(value, ast.List | ast.Tuple | ast.BinOp):
                    for sub in ast.walk(value):
                        if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                            found.setdefault(sub.value, f"{path.name}:{sub.lineno}")
    return found


@cache
def marked_messages() -> dict[str, str]:
    """msgid → file:line of what `babel.cfg` extracts from tally/: the `_()` messages, and in
    tally/cli the --help texts too (`tally.cli.help.extract_help`)."""
    with (REPO / "babel.cfg").open() as cfg:
        method_map, options_map = parse_mapping_cfg(cfg)
    found: dict[str, str] = {}
    for path in sorted(TALLY.rglob("*.py")):
        name = path.relative_to(REPO).as_posix()
        pattern, method = next((p, m) for p, m in method_map if pathmatch(p, name))
        for line, message, _c, _x in extract_from_file(
            method, str(path), keywords={"_": None}, options=options_map[pattern]
        ):
            found.setdefault(str(message), f"{path.name}:{line}")
    return found


CLICK_OWN = ("Show this message and exit.", "Show the version and exit.")  # click's options


def commands(command: click.Command, path: str = "tally") -> Iterator[tuple[str, click.Command]]:
    yield path, command
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            yield from commands(sub, f"{path} {name}")


def help_texts() -> dict[str, str]:
    """Every text `--help` shows of every command → where (`tally job submit --gpus`)."""
    found: dict[str, str] = {}
    for path, command in commands(tally.cli.cli):
        for text in (help_text(command.help), command.short_help, command.epilog):
            if text:
                found.setdefault(text, path)
        for param in command.get_params(click.Context(command)):
            if isinstance(param, click.Option) and param.help:
                found.setdefault(param.help, f"{path} {param.opts[-1]}")
    return found


def fields(text: str) -> set[str]:
    return {name for _t, name, _f, _c in string.Formatter().parse(text) if name is not None}


@pytest.mark.parametrize(
    ("env", "lang"),
    [
        ({"TALLY_LANG": "zh-CN", "LANG": "en_US.UTF-8"}, language.ZH_CN),
        ({"TALLY_LANG": "en", "LANG": "zh_CN.UTF-8"}, language.EN),
        ({"LANG": "zh_CN.UTF-8"}, language.ZH_CN),
        ({"LC_ALL": "C.UTF-8", "LANG": "zh_CN.UTF-8"}, language.EN),
        ({"LC_MESSAGES": "zh_TW.UTF-8"}, language.ZH_CN),
        ({}, language.EN),
    ],
    ids=["tally-lang", "tally-lang-wins", "lang", "lc-all-wins", "lc-messages", "nothing"],
)
def test_the_language_comes_from_the_environment(env: dict[str, str], lang: str) -> None:
    assert language.language(env) == lang


def test_every_marked_message_and_table_header_is_translated() -> None:
    zh = language.messages()
    whatif = {c: "scheduler.whatif.COLUMNS" for c in WHATIF_COLUMNS}  # `tally whatif`'s table
    wanted = {
        **marked_messages(),
        **header_literals(),
        **{d: "--by" for d in DIMENSIONS},
        **whatif,
    }
    assert len(wanted) > 90
    missing = {m: where for m, where in wanted.items() if not zh.get(m, "").strip()}
    assert not missing, f"missing from tally/locale/zh_CN/LC_MESSAGES/tally.po: {missing}"
    assert not {m: t for m, t in zh.items() if fields(m) != fields(t)}


def test_every_help_text_of_every_command_is_translated() -> None:
    zh = language.messages()
    texts = help_texts()
    assert len(texts) > 150
    missing = {text: where for text, where in texts.items() if not zh.get(text, "").strip()}
    assert not missing, f"--help texts missing from the zh_CN catalog: {missing}"
    words = ("Usage:", "Options", "Commands", "env var: {var}", "default: {default}", "required")
    assert all(zh.get(w) for w in words)


def test_babel_extracts_every_help_text() -> None:
    """`pybabel extract -F babel.cfg` finds each help text the commands show (click's own
    --help and --version options aside), so a new one reaches the catalog's template."""
    extracted = marked_messages()
    assert {text for text in help_texts() if text not in extracted} == set(CLICK_OWN)


def test_every_command_speaks_chinese_in_its_help() -> None:
    """Each command's --help in zh-CN: no English help sentence left, the option names and
    choices as they are; in English it is click's own help."""
    runner = CliRunner()
    english = help_texts()
    for path, command in commands(tally.cli.cli):
        assert isinstance(command, Command), path
        args = [*path.split()[1:], "--help"]
        zh = runner.invoke(tally.cli.cli, args, env={"TALLY_LANG": "zh-CN"}, prog_name="tally")
        assert zh.exit_code == 0, zh.output
        assert zh.output.startswith("用法：") and "选项:" in zh.output, path
        flat = " ".join(zh.output.split())
        left = [t for t, where in english.items() if where.startswith(path) and t in flat]
        assert not left, (path, left)
        for param in command.params:
            if isinstance(param, click.Option) and not param.hidden:
                assert all(opt in zh.output for opt in param.opts), (path, param.name)
    en = runner.invoke(tally.cli.cli, ["report", "cost", "--help"], env={"TALLY_LANG": "en"})
    assert en.output.startswith("Usage:") and "[default: team]" in en.output


@pytest.mark.parametrize(
    ("lang", "said"),
    [
        ("zh-CN", "错误：--by：未知维度 nope；可选：{choices}"),
        ("en", "error: --by: unknown dimension nope; choose from {choices}"),
    ],
    ids=["zh-CN", "en"],
)
def test_an_operator_error_is_said_in_the_language(lang: str, said: str) -> None:
    from tally.cli.report import DIMENSIONS

    result = CliRunner().invoke(
        tally.cli.cli, ["report", "cost", "--by", "nope"], env={"TALLY_LANG": lang}
    )
    assert result.exit_code == 2
    assert result.stderr.strip() == said.format(choices=", ".join(DIMENSIONS))


def test_the_by_help_names_every_dimension() -> None:
    from tally.cli.report import DIMENSIONS, cost

    (by,) = [p for p in cost.params if p.name == "by"]
    assert isinstance(by, click.Option) and by.help is not None
    assert by.help.endswith(": " + ", ".join(DIMENSIONS) + ".")


HEADERS = ["team", "gpu_hours", "cost"]
ROWS = [["vision", 12.5, "3.20 USD"], ["nlp", 1.0, "0.10 USD"]]


def test_a_table_speaks_chinese_and_stays_aligned() -> None:
    text = render(HEADERS, ROWS, OutputFormat.TABLE, language.ZH_CN)
    head, *lines = text.split("\n")
    assert head.split() == ["团队", "GPU", "小时", "成本"]
    assert render(HEADERS, ROWS, OutputFormat.TABLE, language.EN).startswith("TEAM")
    # a Chinese character takes two terminal columns: "团队" is padded to "vision"'s 6, not 2+4
    assert head.startswith("团队" + " " * 2 + "  GPU")
    assert [line[:8] for line in lines] == ["vision  ", "nlp     "]


@pytest.mark.parametrize("fmt", [OutputFormat.JSON, OutputFormat.CSV], ids=["json", "csv"])
def test_machine_output_never_changes_with_the_language(fmt: OutputFormat) -> None:
    zh = render(HEADERS, ROWS, fmt, language.ZH_CN)
    assert zh == render(HEADERS, ROWS, fmt, language.EN)
    if fmt is OutputFormat.JSON:
        assert list(orjson.loads(zh)[0]) == HEADERS


@pytest.mark.parametrize(
    ("lang", "said"),
    [("zh-CN", "错误：{directory} 下没有账本"), ("en", "error: no ledger at {directory}")],
    ids=["zh-CN", "en"],
)
def test_an_error_that_ends_a_command_is_said_in_the_language(
    tmp_path: Path, lang: str, said: str
) -> None:
    missing = tmp_path / "nowhere"
    result = CliRunner().invoke(
        tally.cli.cli,
        ["report", "cost", "--data-dir", str(missing), "-o", "json"],
        env={"TALLY_LANG": lang},
    )
    assert result.exit_code == 4
    assert result.stderr.strip() == said.format(directory=missing)


WHATIF = REPO / "scheduler" / "whatif"
WHATIF_WORDS = REPO / "ledger" / "read" / "whatif_words.py"


def test_every_word_whatif_prints_is_translated() -> None:
    """`tally whatif`'s table and checks say the report through `scheduler.whatif.texts` and
    `ledger.read.whatif_words` (msgids marked `tr`/`N_`): each is in the catalogs the CLI
    reads for them (`tally.language.reader`) with its placeholders; the CLI's own lines are
    marked `_()` (the test above)."""
    keywords = {"tr": None, "N_": None}
    found = {
        str(message): f"{path}:{line}"
        for path, line, message, _c, _x in extract_from_dir(
            str(WHATIF), method_map=[("**.py", "python")], keywords=keywords
        )
    }
    words = WHATIF_WORDS
    found |= {
        str(message): f"{words.name}:{line}"
        for line, message, _c, _x in extract_from_file("python", str(words), keywords=keywords)
    }
    assert len(found) > 20
    zh = language.read_model_messages()
    missing = {m: where for m, where in found.items() if not zh.get(m, "").strip()}
    assert not missing, f"missing from the zh_CN catalogs: {missing}"
    assert not {m: zh[m] for m in found if fields(m) != fields(zh[m])}


# ------------------------------------------------------------------ click's own words (#15 item 9)

CLICK_DIR = Path(click.__file__).parent


def click_msgids() -> dict[str, str]:
    """Every message click marks for gettext (Babel's extraction of the installed click),
    both forms of a plural → file:line."""
    found: dict[str, str] = {}
    for path, line, message, _c, _x in extract_from_dir(
        str(CLICK_DIR), method_map=[("**.py", "python")], keywords={"_": None, "ngettext": (1, 2)}
    ):
        for text in message if isinstance(message, tuple) else (message,):
            found.setdefault(str(text), f"click/{path}:{line}")
    return found


def test_every_click_module_speaks_through_the_catalog() -> None:
    """Each click module that imports the standard library's gettext has it pointed at ours,
    and every message click marks has a Chinese translation with its placeholders."""
    using = [
        f"click.{p.stem}"
        for p in sorted(CLICK_DIR.glob("*.py"))
        if re.search(r"^from gettext import", p.read_text(), re.MULTILINE)
    ]
    assert len(using) >= 8 and set(using) <= set(click_words.CLICK_MODULES)
    click_words.install()
    for name in using:
        module = importlib.import_module(name)
        if hasattr(module, "_"):
            assert module._ is click_words.gettext, name
        if hasattr(module, "ngettext"):
            assert module.ngettext is click_words.ngettext, name
    zh = language.messages()
    msgids = click_msgids()
    assert len(msgids) > 50
    missing = {m: where for m, where in msgids.items() if not zh.get(m, "").strip()}
    assert not missing, f"click's messages missing from the zh_CN catalog: {missing}"
    assert not {m: zh[m] for m in msgids if fields(m) != fields(zh[m])}


@pytest.mark.parametrize(
    ("args", "lang", "lines"),
    [
        (
            ["report", "cost", "--perod", "2026-11"],
            "zh-CN",
            [
                "用法： tally report cost [OPTIONS]",
                "运行 'tally report cost -h' 查看帮助。",
                "",
                "错误：没有此选项：--perod 您是不是要用 --period？",
            ],
        ),
        (
            ["report", "cost", "--perod", "2026-11"],
            "en",
            [
                "Usage: tally report cost [OPTIONS]",
                "Try 'tally report cost -h' for help.",
                "",
                "Error: No such option: --perod Did you mean --period?",
            ],
        ),
        (
            ["job", "explain"],
            "zh-CN",
            [
                "用法： tally job explain [OPTIONS] JOB_ID",
                "运行 'tally job explain -h' 查看帮助。",
                "",
                "错误：缺少参数 'JOB_ID'.",
            ],
        ),
        (
            ["job", "explain"],
            "en",
            [
                "Usage: tally job explain [OPTIONS] JOB_ID",
                "Try 'tally job explain -h' for help.",
                "",
                "Error: Missing argument 'JOB_ID'.",
            ],
        ),
    ],
    ids=["wrong-option-zh", "wrong-option-en", "missing-argument-zh", "missing-argument-en"],
)
def test_clicks_usage_errors_are_said_in_the_language(
    args: list[str], lang: str, lines: list[str]
) -> None:
    result = CliRunner().invoke(tally.cli.cli, args, env={"TALLY_LANG": lang}, prog_name="tally")
    assert result.exit_code == 2
    assert result.stderr.splitlines() == lines


# ------------------------------------------------- configuration and broker errors (#15 item 9)


@pytest.mark.parametrize(
    ("change", "lang", "said"),
    [
        ({"ledger": {"nope": 1}}, "zh-CN", "{path}: ledger.nope: 不允许的额外字段"),
        ({"ledger": {"nope": 1}}, "en", "{path}: ledger.nope: Extra inputs are not permitted"),
        ({"ledger": {"seal_interval_s": 0}}, "zh-CN", "{path}: ledger.seal_interval_s: 应大于 0"),
        (
            {"ledger": {"seal_interval_s": 0}},
            "en",
            "{path}: ledger.seal_interval_s: Input should be greater than 0",
        ),
    ],
    ids=["extra-zh", "extra-en", "greater-than-zh", "greater-than-en"],
)
def test_a_config_error_is_framed_in_the_language(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    change: dict[str, dict[str, int]],
    lang: str,
    said: str,
) -> None:
    """pydantic's sentence in the language; the file, the field path and values as they are."""
    data = a_config_dict()
    for section, values in change.items():
        data[section] = {**data.get(section, {}), **values}
    path = write_config(tmp_path / "t.yaml", data)
    monkeypatch.setenv("TALLY_LANG", lang)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value) == said.format(path=path)


@pytest.mark.parametrize(
    ("lang", "said"),
    [("zh-CN", "错误：{path}：文件不存在"), ("en", "error: {path}: no such file")],
    ids=["zh-CN", "en"],
)
def test_a_missing_config_file_is_said_in_the_language(
    tmp_path: Path, lang: str, said: str
) -> None:
    missing = tmp_path / "none.yaml"
    result = CliRunner().invoke(
        tally.cli.cli, ["report", "cost", "-c", str(missing)], env={"TALLY_LANG": lang}
    )
    assert result.exit_code == 2
    assert result.stderr.strip() == said.format(path=missing)


def broker_templates() -> dict[str, str]:
    """The message of every `BrokerError(...)` raised in the source → file:line; a message
    that is not a literal template (an f-string) fails here, as it could not be translated."""
    found: dict[str, str] = {}
    for directory in (REPO / "streams", TALLY):
        for path in sorted(directory.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "BrokerError":
                    where = f"{path.name}:{node.lineno}"
                    (first, *_rest) = node.args
                    assert isinstance(first, ast.Constant), f"{where}: not a literal template"
                    found.setdefault(str(first.value), where)
    return found


def test_every_broker_error_is_translated() -> None:
    zh = language.messages()
    templates = broker_templates()
    assert len(templates) >= 8
    missing = {t: where for t, where in templates.items() if not zh.get(t, "").strip()}
    assert not missing, missing
    assert not {t: zh[t] for t in templates if fields(t) != fields(zh[t])}
    assert zh.get(INSTALL_EMBEDDED, "").strip()  # EmbeddedBrokerMissing's message


@pytest.mark.parametrize(
    ("lang", "said"),
    [
        (
            "zh-CN",
            "h:9092 上的消息代理在 5 秒后仍未就绪：h:9092 上的消息代理没有应答元数据请求："
            "[Errno 111] refused",
        ),
        (
            "en",
            "broker at h:9092 not ready after 5s: broker at h:9092 did not answer a metadata "
            "request: [Errno 111] refused",
        ),
    ],
    ids=["zh-CN", "en"],
)
def test_a_broker_error_is_said_in_the_language(
    monkeypatch: pytest.MonkeyPatch, lang: str, said: str
) -> None:
    """The framing translated, the inner error's too; the address and the OS's words as
    they are; `str` is always the English."""
    inner = BrokerError(
        "broker at {bootstrap} did not answer a metadata request: {problem}",
        bootstrap="h:9092",
        problem=ConnectionRefusedError(111, "refused"),
    )
    error = BrokerError(
        "broker at {bootstrap} not ready after {seconds}s: {problem}",
        bootstrap="h:9092",
        seconds="5",
        problem=inner,
    )
    monkeypatch.setenv("TALLY_LANG", lang)
    assert options.said(error) == said
    assert str(error).startswith("broker at h:9092 not ready after 5s: broker at h:9092")


# ------------------------------------ statements and explanations, times in tables (#15 items 8, 9)


def test_a_statement_speaks_the_clis_language() -> None:
    """`tally report statement`'s text through the CLI's reader: the read models' sentences
    (translated in the dashboard's catalog) in Chinese; English as it always was."""
    line = StatementLine("detection", 7_200_000, 12_000_000, 3_600_000, 1_500_000)
    statement = TeamStatement(
        "vision", "2026-11", "USD", ("research",), 7_200_000, 12_000_000, 3_600_000, 1_500_000,
        250_000, 0, IdleSharing.WEIGHTED, 2_000_000, (line,), (replace(line, name="ada"),),
        (Budget(Unit.MONEY, 20_000_000, 12_000_000),),
    )  # fmt: skip
    zh = statement.render_text(language.reader(language.ZH_CN))
    assert zh.startswith("团队 vision 对账单，2026-11（USD）\n成本中心：research")
    assert statement.render_text(language.reader(language.EN)) == statement.render_text()


SHANGHAI = ZoneInfo("Asia/Shanghai")


def test_an_explanation_is_written_from_the_apis_events_in_chinese() -> None:
    """`tally job explain` in zh-CN: the API's envelopes decoded, the Team page's reading
    through the CLI's reader, every time on the ledger's clock and named; the scheduler's
    free-text note quoted as written."""
    events = history()
    answer = {
        "job_id": "job-a",
        "explanation": "(the scheduler's English)",
        "as_of_us": events[0].time_us + 100 * MIN,
        "events": [orjson.loads(encode_job_event(e, "tally://scheduler")) for e in events],
    }
    text = explanation_text(answer, language.reader(language.ZH_CN), SHANGHAI)
    headline, *rest = text.split("\n")
    assert re.search("[\u4e00-\u9fff]", headline) and "job-a" in headline
    timeline = [line for line in rest if re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d ", line)]
    assert len(timeline) >= 5
    first = events[0].time_us
    assert timeline[0].startswith(when_text(first, SHANGHAI) + "  ")
    assert when_text(first, SHANGHAI).endswith(" Asia/Shanghai")
    assert "UTC" not in text
    english = explanation_text(answer, language.reader(language.EN))
    assert "job-a" in english and not re.search("[\u4e00-\u9fff]", english)


@pytest.mark.parametrize(
    ("fmt", "zone", "shown"),
    [
        (OutputFormat.TABLE, UTC, "2026-11-30T16:00:00Z"),
        (OutputFormat.TABLE, SHANGHAI, "2026-12-01T00:00:00+08:00"),
        (OutputFormat.JSON, SHANGHAI, "2026-11-30T16:00:00Z"),
        (OutputFormat.CSV, SHANGHAI, "2026-11-30T16:00:00Z"),
    ],
    ids=["table-utc", "table-shanghai", "json-utc", "csv-utc"],
)
def test_a_tables_times_follow_the_ledgers_clock(
    fmt: OutputFormat, zone: tzinfo, shown: str
) -> None:
    """The first instant of December in Shanghai (16:00 UTC on 30 November): a table shows
    it on the ledger's clock with its offset, JSON and CSV in UTC as documented."""
    december_us = 1_796_054_400_000_000  # 2026-11-30T16:00:00Z, exactly
    assert shown_time(december_us, fmt, zone) == shown


@pytest.mark.parametrize(
    "order", [("zh_CN", "en"), ("en", "zh_CN")], ids=["chinese-first", "english-first"]
)
def test_the_help_option_speaks_the_language_of_each_run(monkeypatch, order):
    """click keeps a command's `--help` option from its first run: a later run in the other
    language must still say it in its own."""
    said = {}
    for lang in order:
        monkeypatch.setenv("TALLY_LANG", lang)
        result = CliRunner().invoke(tally.cli.cli, ["report", "cost", "--help"])
        assert result.exit_code == 0, result.output
        said[lang] = result.output
    assert "Show this message and exit." in said["en"]
    assert "Show this message and exit." not in said["zh_CN"]
