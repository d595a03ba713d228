"""How the CLI prints results: aligned tables for people, JSON and CSV for scripts."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from enum import StrEnum
from typing import Any
from unicodedata import east_asian_width

import orjson

from tally.language import header


class OutputFormat(StrEnum):
    TABLE = "table"
    JSON = "json"
    CSV = "csv"


def render(
    headers: Sequence[str],
    rows: Sequence[Sequence[Any]],
    fmt: OutputFormat,
    lang: str | None = None,
) -> str:
    """`rows` under `headers` in `fmt`; only the table's headings follow the language (`lang`,
    default the environment's: `tally.language`), never JSON or CSV."""
    if fmt is OutputFormat.JSON:
        return orjson.dumps(
            [dict(zip(headers, row, strict=True)) for row in rows], option=orjson.OPT_INDENT_2
        ).decode()
    if fmt is OutputFormat.CSV:
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(headers)
        writer.writerows(rows)
        return buffer.getvalue().rstrip("\n")
    return table(headers, rows, lang)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], lang: str | None = None) -> str:
    """A plain aligned table; numbers are right-aligned, the rest left-aligned."""
    headings = [header(h, lang) for h in headers]
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [_width(h) for h in headings]
    for row in cells:
        for i, value in enumerate(row):
            widths[i] = max(widths[i], _width(value))
    numeric = [
        bool(rows) and all(isinstance(r[i], int | float) or _is_amount(r[i]) for r in rows)
        for i in range(len(headers))
    ]

    def line(values: Sequence[str]) -> str:
        return "  ".join(
            _pad(v, widths[i], right=numeric[i]) for i, v in enumerate(values)
        ).rstrip()

    out = [line(headings)]
    out += [line(row) for row in cells]
    return "\n".join(out)


def _width(text: str) -> int:
    """Terminal columns `text` takes: East Asian wide characters (Chinese) take two."""
    return sum(2 if east_asian_width(c) in "WF" else 1 for c in text)


def _pad(text: str, width: int, *, right: bool) -> str:
    fill = " " * (width - _width(text))
    return fill + text if right else text + fill


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)


def _is_amount(value: Any) -> bool:
    return isinstance(value, str) and value.replace(".", "", 1).replace("-", "", 1).isdigit()
