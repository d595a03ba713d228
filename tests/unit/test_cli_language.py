"""The `tally` CLI in Simplified Chinese: the language from $TALLY_LANG or the POSIX locale, a
Chinese catalog entry for every marked message, every table header the commands print and every
`--help` text of every command (the click command tree walked), `babel.cfg`'s extraction finding
every help text, table headings translated and aligned, JSON and CSV the same in every language,
and an error that ends a command said in Chinese with its exit code unchanged."""

from __future__ import annotations

import ast
import re
import string
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import click
import orjson
import pytest
from babel.messages.extract import extract_from_file
from babel.messages.frontend import parse_mapping_cfg
from babel.util import pathmatch
from click.testing import CliRunner

import tally.cli
from tally import language
from tally.cli.help import Command, help_text
from tally.output import OutputFormat, render
from tests.conftest import REPO

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
    wanted = {**marked_messages(), **header_literals(), **{d: "--by" for d in DIMENSIONS}}
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
