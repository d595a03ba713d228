"""How the CLI prints results: aligned tables for people, JSON and CSV for scripts."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from enum import StrEnum
from typing import Any

import orjson


class OutputFormat(StrEnum):
    TABLE = "table"
    JSON = "json"
    CSV = "csv"


def render(headers: Sequence[str], rows: Sequence[Sequence[Any]], fmt: OutputFormat) -> str:
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
    return table(headers, rows)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain aligned table; numbers are right-aligned, the rest left-aligned."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, value in enumerate(row):
            widths[i] = max(widths[i], len(value))
    numeric = [
        bool(rows) and all(isinstance(r[i], int | float) or _is_amount(r[i]) for r in rows)
        for i in range(len(headers))
    ]

    def line(values: Sequence[str]) -> str:
        return "  ".join(
            v.rjust(widths[i]) if numeric[i] else v.ljust(widths[i]) for i, v in enumerate(values)
        ).rstrip()

    out = [line([h.upper() for h in headers])]
    out += [line(row) for row in cells]
    return "\n".join(out)


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)


def _is_amount(value: Any) -> bool:
    return isinstance(value, str) and value.replace(".", "", 1).replace("-", "", 1).isdigit()
