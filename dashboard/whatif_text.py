"""The What-if page's words for a saved report in the session's language: the comparison
table's metric and scope names, its durations, the flags and the capacity sentence.

A saved report (`tally whatif --save`) holds them as the English text `scheduler.whatif`
wrote; the page shows them in Chinese by reading them back into values (a metric's code, a
scope's kind and name, a duration's microseconds) and writing them again through the catalog.
The divergences from the record too: where each job was admitted, and the cause, whose wait
reason the report names by its code (`no_capacity`: shown as the Team page's few words; the
scheduler's free-text notes are not in a report). What it does not recognise it shows as it
is; the CSV download keeps the report's own text. Every function takes the session's
`Translator` (msgids marked `tr`/`N_`), so it is pure.
"""

from __future__ import annotations

import re
from typing import Any

from dashboard.i18n import EN, N_, Translator
from ledger.job_events import WaitReason
from ledger.read.job_history import NOT_YET_CONSIDERED, WAIT_SHORT, duration_text
from ledger.read.whatif_words import metric_name, scope_name

_S, _MIN, _H, _D = 1_000_000, 60_000_000, 3_600_000_000, 86_400_000_000
# `ledger.read.job_history.duration_text`'s English forms: (pattern, µs of its two numbers)
_DURATIONS = (
    (re.compile(r"(\d+) s"), _S, 0),
    (re.compile(r"(\d+) min"), _MIN, 0),
    (re.compile(r"(\d+) h (\d+) min"), _H, _MIN),
    (re.compile(r"(\d+) d (\d+) h"), _D, _H),
)
_FLAG = re.compile(r"team (\S+): p95 wait rose from (.+) to (.+)")


def duration(text: str, tr: Translator) -> str:
    """A duration `duration_text` wrote in English, in `tr`'s language (else as it is)."""
    for pattern, first, second in _DURATIONS:
        if (m := pattern.fullmatch(text)) is not None:
            rest = int(m[2]) * second if second else 0
            return duration_text(int(m[1]) * first + rest, tr)
    return text


def metric(code: str, tr: Translator) -> str:
    return metric_name(code, tr)


def scope(text: str, tr: Translator) -> str:
    return scope_name(text, tr)


def row(values: dict[str, Any], tr: Translator) -> list[str]:
    """A saved comparison row (`metric`, `scope`, `baseline`, `alternative`) as the page
    shows it, in that order: in English the report's own words (metric codes and all)."""
    if tr.language == EN:
        return [str(values[c]) for c in ("metric", "scope", "baseline", "alternative")]
    return [
        metric(str(values["metric"]), tr),
        scope(str(values["scope"]), tr),
        duration(str(values["baseline"]), tr),
        duration(str(values["alternative"]), tr),
    ]


def flag(text: str, tr: Translator) -> str:
    """`team T: p95 wait rose from X to Y` in the session's language."""
    m = _FLAG.fullmatch(text)
    if m is None:
        return text
    return tr("team {team}: p95 wait rose from {before} to {after}").format(
        team=m[1], before=duration(m[2], tr), after=duration(m[3], tr)
    )


def capacity(doc: dict[str, Any], tr: Translator) -> str:
    """The capacity sentence of a report that added GPUs, from its figures (`added_gpus`,
    `wait_p95_us`); the saved text where they are missing."""
    added, waits = doc.get("added_gpus"), doc.get("wait_p95_us")
    if not added or not waits or len(waits) != 2:
        return str(doc.get("capacity") or "")
    what = tr(" and ").join(
        tr("{count} GPUs of model {model}").format(count=n, model=m)
        for m, n in sorted(added.items())
    )
    before, after = (duration_text(int(w), tr) for w in waits)
    if waits[0] == waits[1]:
        return tr("adding {what} would leave p95 wait at {wait}").format(what=what, wait=before)
    said = (
        tr("adding {what} would cut p95 wait from {before} to {after}")
        if waits[1] < waits[0]
        else tr("adding {what} would raise p95 wait from {before} to {after}")
    )
    return said.format(what=what, before=before, after=after)


# `scheduler.whatif.compare.divergences`' English: where a job was first admitted, and why the
# record and the replay differ; a wait reason is its code there (`no_capacity`)
_WHERE = re.compile(r"\+(.+) on (\S+)")
_NOT_ADMITTED = "not admitted"
_NOT_CONSIDERED = "not yet considered"
_CYCLE_LIMIT = "cycle_limit"  # the replay's tick ran out of cycles (`scheduler.whatif.Limit`)
_CAUSES = (
    (re.compile(r"placed on (\S+) instead of (\S+)"), None),
    (re.compile(r"the replay kept it waiting \((.+)\)"), N_("the replay kept it waiting ({why})")),
    (re.compile(r"the record kept it waiting \((.+)\)"), N_("the record kept it waiting ({why})")),
    (
        re.compile(r"the replay never admitted it \((.+)\)"),
        N_("the replay never admitted it ({why})"),
    ),
    (
        re.compile(r"never admitted in the record \((.+)\)"),
        N_("never admitted in the record ({why})"),
    ),
)


def where(text: str, tr: Translator) -> str:
    """A divergence's `recorded`/`replayed` cell: `+3 h 05 min on pool/model`, `not admitted`."""
    if text == _NOT_ADMITTED:
        return tr("not admitted")
    m = _WHERE.fullmatch(text)
    if m is None:
        return text
    return tr("+{after} on {place}").format(after=duration(m[1], tr), place=m[2])


def _why(code: str, tr: Translator) -> str:
    first, then, last = code.partition(", then ")  # the reason then, and the last one
    if then:
        return tr("{first}, then {last}").format(first=_why(first, tr), last=_why(last, tr))
    if code == _NOT_CONSIDERED:
        return tr(NOT_YET_CONSIDERED)
    if code == _CYCLE_LIMIT:
        return tr("the tick ran out of cycles")
    try:
        return tr(WAIT_SHORT[WaitReason(code)])
    except ValueError:
        return code


def cause(text: str, tr: Translator) -> str:
    """Why the record and the baseline replay differ for a job, in the session's language: the
    sentence from its parts, the wait reason's code as its few words."""
    for pattern, said in _CAUSES:
        m = pattern.fullmatch(text)
        if m is None:
            continue
        if said is None:
            return tr("placed on {replayed} instead of {recorded}").format(
                replayed=m[1], recorded=m[2]
            )
        return tr(said).format(why=_why(m[1], tr))
    return text


def divergence(values: dict[str, Any], tr: Translator) -> list[str]:
    """A saved divergence (`job_id`, `recorded`, `replayed`, `cause`) as the page shows it, in
    that order; in English the report's own words."""
    if tr.language == EN:
        return [str(values[c]) for c in ("job_id", "recorded", "replayed", "cause")]
    return [
        str(values["job_id"]),
        where(str(values["recorded"]), tr),
        where(str(values["replayed"]), tr),
        cause(str(values["cause"]), tr),
    ]
