"""The `tally` CLI in Simplified Chinese: the language from $TALLY_LANG or the POSIX locale, a
Chinese catalog entry for every marked message and every table header the commands print, table
headings translated and aligned, JSON and CSV the same in every language, and an error that ends
a command said in Chinese with its exit code unchanged."""

from __future__ import annotations

import ast
import re
import string
from pathlib import Path

import orjson
import pytest
from babel.messages.extract import extract_from_dir
from click.testing import CliRunner

import tally.cli
from tally import language
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


def marked_messages() -> dict[str, str]:
    return {
        str(message): f"{Path(path).name}:{line}"
        for path, line, message, _c, _x in extract_from_dir(
            str(TALLY), method_map=[("**.py", "python")], keywords={"_": None}
        )
    }


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
