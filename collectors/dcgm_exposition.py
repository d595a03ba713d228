"""The Prometheus exposition format as dcgm-exporter prints it: sample lines in, parsed rows
and grouped problems out.

This module owns:
- `split_sample_lines`: the lines worth parsing. `# HELP` and `# TYPE` lines are dropped before
  parsing (exporters' help texts are known to be wrong, so payloads with and without them read
  alike), and so are lines of families the caller does not ask for. A line whose value or
  timestamp is not a number is reported here, because one of them makes the Prometheus parser
  reject the whole payload;
- `parse_lines`: (line, parsed sample) for every line `prometheus_client`'s parser accepts; the
  block is parsed at once and, only when the parser rejects it, line by line;
- `ProblemKind`, `DcgmProblem` and `ProblemLog`: rows that were not used, grouped per kind and
  family in order of first appearance, with the first `MAX_PROBLEM_LINES` lines kept;
- `problem_dead_letter`: a problem as a `DeadLetter` carrying the offending lines.

What the rows mean (families, units, labels) is `collectors.dcgm_fields`'; turning them into
samples is `collectors.dcgm_parse`'. Nothing here raises for bad text.
"""

from __future__ import annotations

import re
from collections.abc import Container, Iterator
from dataclasses import dataclass
from enum import StrEnum

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from ledger.events import DeadLetter

MAX_PROBLEM_LINES = 64  # lines kept per problem; `DcgmProblem.count` has the full number
MAX_DEAD_LETTER_CHARS = 16_384

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


# ---------------------------------------------------------------------------- problems


class ProblemKind(StrEnum):
    """Why rows of a payload were not used."""

    UNPARSABLE = "unparsable"  # the Prometheus text parser rejects the line
    NOT_A_NUMBER = "not_a_number"  # value missing or not a number
    NOT_FINITE = "not_finite"  # NaN or ±Inf
    NEGATIVE = "negative"
    OUT_OF_RANGE = "out_of_range"  # beyond the field's range once converted
    MISSING_UUID = "missing_uuid"
    BAD_LABEL = "bad_label"  # GPU index, MIG id/profile, or a label too long to carry
    DUPLICATE = "duplicate"  # a second row for one GPU (slice) and family; the first is kept


@dataclass(frozen=True, slots=True)
class DcgmProblem:
    """Rows of one payload that were dropped, for one reason and one family.

    `lines` holds the first `MAX_PROBLEM_LINES` offending lines as printed; `count` all of them.
    """

    kind: ProblemKind
    family: str | None
    detail: str
    lines: tuple[str, ...]
    count: int


def problem_dead_letter(problem: DcgmProblem) -> DeadLetter:
    """The dead-letter record of a problem; its payload is the offending lines."""
    payload = "\n".join(problem.lines)
    if len(payload) > MAX_DEAD_LETTER_CHARS:
        payload = payload[:MAX_DEAD_LETTER_CHARS] + "…"
    family = f" {problem.family}" if problem.family else ""
    return DeadLetter(
        reason=f"dcgm {problem.kind.value}{family}: {problem.detail} ({problem.count} rows)",
        payload=payload,
    )


class _Group:
    __slots__ = ("count", "detail", "lines")

    def __init__(self, detail: str) -> None:
        self.detail = detail
        self.lines: list[str] = []
        self.count = 0


class ProblemLog:
    """Problems in order of first appearance, grouped per (kind, family)."""

    def __init__(self) -> None:
        self._groups: dict[tuple[ProblemKind, str | None], _Group] = {}

    def add(self, kind: ProblemKind, family: str | None, detail: str, line: str) -> None:
        group = self._groups.get((kind, family))
        if group is None:
            group = self._groups[(kind, family)] = _Group(detail)
        if len(group.lines) < MAX_PROBLEM_LINES:
            group.lines.append(line)
        group.count += 1

    def result(self) -> tuple[DcgmProblem, ...]:
        return tuple(
            DcgmProblem(kind, family, group.detail, tuple(group.lines), group.count)
            for (kind, family), group in self._groups.items()
        )


# ---------------------------------------------------------------------------- parsing


def _is_number(token: str) -> bool:
    if "_" in token:  # float() accepts 1_000, the Prometheus parser does not
        return False
    try:
        float(token)
    except ValueError:
        return False
    return True


def split_sample_lines(
    text: str, families: Container[str], problems: ProblemLog
) -> list[tuple[str, str | None]]:
    """The sample lines worth parsing, as (line, metric name or None when only the parser can
    tell). Comments go; lines of unknown families go; lines whose value or timestamp is not a
    number are reported here, because one of them makes the parser reject the whole payload."""
    kept: list[tuple[str, str | None]] = []
    for raw in text.split("\n"):
        line = raw.strip()
        if not line or line[0] == "#":
            continue
        if line[0] == "{":  # the name is a label (`{"name", ...}`): only the parser can tell
            kept.append((line, None))
            continue
        match = _METRIC_NAME.match(line)
        if match is None:
            problems.add(ProblemKind.UNPARSABLE, None, "not a metric line", line)
            continue
        name = match.group()
        if name not in families:
            continue
        rest = line[match.end() :]
        after = rest.lstrip(" \t")
        if after[:1] == "{":
            close = after.rfind("}")
            if close == -1:
                problems.add(ProblemKind.UNPARSABLE, name, "labels are not closed", line)
                continue
            after = after[close + 1 :]
        elif after and len(after) == len(rest):  # the name runs into something else
            problems.add(ProblemKind.UNPARSABLE, name, "not a metric name", line)
            continue
        tokens = after.split()
        if not tokens or not _is_number(tokens[0]) or not _is_number(tokens[-1]):
            problems.add(ProblemKind.NOT_A_NUMBER, name, "the value is not a number", line)
            continue
        kept.append((line, name))
    return kept


def _samples_of(text: str) -> list[Sample]:
    samples: list[Sample] = []
    for family in text_string_to_metric_families(text):
        samples.extend(family.samples)
    return samples


def parse_lines(
    lines: list[tuple[str, str | None]], problems: ProblemLog
) -> Iterator[tuple[str, Sample]]:
    """(line, parsed sample) for every line the Prometheus parser accepts.

    Without comment lines every sample line is its own family, so the parser's samples are the
    lines' samples in order; only when it rejects the block are lines parsed one by one.
    """
    try:
        samples = _samples_of("\n".join(line for line, _ in lines))
    except Exception:  # the parser raises assorted errors on bad input; the fallback reports
        samples = []
    if len(samples) == len(lines):
        yield from zip((line for line, _ in lines), samples, strict=True)
        return
    for line, name in lines:
        try:
            parsed = _samples_of(line)
        except Exception as exc:  # as above: the line's problem, not the caller's
            problems.add(ProblemKind.UNPARSABLE, name, _short(str(exc)), line)
            continue
        if len(parsed) == 1:
            yield line, parsed[0]
        else:
            problems.add(ProblemKind.UNPARSABLE, name, "not one sample", line)


def _short(message: str) -> str:
    return message if len(message) <= 120 else message[:120] + "…"
