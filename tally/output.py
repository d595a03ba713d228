"""How the CLI prints results: aligned tables for people, JSON and CSV for scripts; the times in
them (a table's on the ledger's clock, JSON's and CSV's in UTC)."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta, tzinfo
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


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def utc_time(time_us: int) -> str:
    """An instant to the second as ISO 8601 in UTC (`2026-11-30T16:00:00Z`): what JSON and CSV
    print (integer µs, no float on the way)."""
    return (_EPOCH + timedelta(microseconds=time_us)).strftime("%Y-%m-%dT%H:%M:%SZ")


def shown_time(time_us: int, fmt: OutputFormat, zone: tzinfo) -> str:
    """An instant as a command prints it: in a table on the ledger's clock (`ledger.timezone`),
    ISO 8601 with its offset (`2026-12-01T00:00:00+08:00`; in UTC `…Z`, as JSON and CSV);
    in JSON and CSV always UTC (`utc_time`), whatever the zone."""
    if fmt is not OutputFormat.TABLE or zone is UTC:
        return utc_time(time_us)
    local = (_EPOCH + timedelta(microseconds=time_us)).astimezone(zone)
    return local.isoformat(timespec="seconds")
