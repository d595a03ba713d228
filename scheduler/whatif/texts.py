"""The what-if's words for people: the comparison's metric and scope names, waits, budget
overruns, the flags, the capacity sentence, and where a job was first admitted and why the
record and a replay differ.

Every function writes from values (microseconds, GPU counts, admissions, codes), never from
another text, through a `ledger.read.texts.Translate` (English by default). The msgids are
marked `tr`/`N_` here; their one translation is in the dashboard's catalog, which the CLI reads
for them (`tally.language.reader`: the CLI's own catalog first); `tests/unit/test_cli_language.py`
fails on one that neither has.

Two registers: the report's own text (`-o json`, `-o csv`, a saved report) is English with codes
where a program reads them — a metric (`gpu_hours`), a scope (`team:vision`), the wait reason in
a cause (`no_capacity`); a table says them in words in the reader's language (`GPU-hours`,
`team vision`, `GPUs busy`; `GPU 小时`, `团队 vision`, `GPU 繁忙`).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

from ledger.read.job_history import NOT_YET_CONSIDERED, WAIT_SHORT, duration_text
from ledger.read.texts import N_, Translate, english
from scheduler.whatif.history import Admission, Limit, Why

NOT_CONSIDERED_CODE = "not yet considered"  # a cause's wait reason in the report: none yet


class Cause(StrEnum):
    """How a job's first admission differs between the record and a replay."""

    ELSEWHERE = "elsewhere"  # both admitted it, on different (pool, model)s
    REPLAY_WAITED = "replay_waited"  # the replay admitted it later than the record
    RECORD_WAITED = "record_waited"  # the record admitted it later than the replay
    REPLAY_NEVER = "replay_never"  # only the record admitted it
    RECORD_NEVER = "record_never"  # only the replay admitted it


CAUSES = {
    Cause.REPLAY_WAITED: N_("the replay kept it waiting ({why})"),
    Cause.RECORD_WAITED: N_("the record kept it waiting ({why})"),
    Cause.REPLAY_NEVER: N_("the replay never admitted it ({why})"),
    Cause.RECORD_NEVER: N_("never admitted in the record ({why})"),
}


def wait_text(us: int, tr: Translate = english) -> str:
    """A wait: `45 s`, `3 h 05 min` (`3 小时 05 分`)."""
    return duration_text(us, tr)


def gpu_hours_text(hours: str, tr: Translate = english) -> str:
    """GPU-hours (exact text, `gpu_hours`) with their unit: `1.500 GPU-h`."""
    return tr("{hours} GPU-h").format(hours=hours)


def flag_text(team: str, before_us: int, after_us: int, tr: Translate = english) -> str:
    return tr("team {team}: p95 wait rose from {before} to {after}").format(
        team=team, before=wait_text(before_us, tr), after=wait_text(after_us, tr)
    )


def capacity_text(
    added: Mapping[str, int], before_us: int, after_us: int, tr: Translate = english
) -> str:
    """ "adding N GPUs of model M would cut p95 wait from X to Y" (or leave it, or raise it)."""
    what = tr(" and ").join(
        tr("{count} GPUs of model {model}").format(count=n, model=m)
        for m, n in sorted(added.items())
    )
    before, after = wait_text(before_us, tr), wait_text(after_us, tr)
    if before_us == after_us:
        return tr("adding {what} would leave p95 wait at {wait}").format(what=what, wait=before)
    said = (
        tr("adding {what} would cut p95 wait from {before} to {after}")
        if after_us < before_us
        else tr("adding {what} would raise p95 wait from {before} to {after}")
    )
    return said.format(what=what, before=before, after=after)


def where_text(first: Admission | None, since_us: int, tr: Translate = english) -> str:
    """Where and when (after the window's start) a job was first admitted: `+3 h 05 min on
    h100/H100`, or `not admitted`."""
    if first is None:
        return tr("not admitted")
    return tr("+{after} on {place}").format(
        after=wait_text(first.time_us - since_us, tr), place=f"{first.pool}/{first.model}"
    )


# a tick's own limits in a table's words (a wait reason's are the Team page's, `WAIT_SHORT`)
LIMIT_WORDS: Mapping[Limit, str] = {Limit.CYCLES: N_("the tick ran out of cycles")}


def why_code(why: Why | None) -> str:
    """A cause's wait reason as the report names it: its code (`no_capacity`, `cycle_limit`)."""
    return NOT_CONSIDERED_CODE if why is None else why.value


def why_words(why: Why | None, tr: Translate = english) -> str:
    """A cause's wait reason as a table says it: the Team page's few words (`GPUs busy`)."""
    if why is None:
        return tr(NOT_YET_CONSIDERED)
    if isinstance(why, Limit):
        return tr(LIMIT_WORDS[why])
    return tr(WAIT_SHORT[why]) if why in WAIT_SHORT else why.value


def reasons_words(why: Why | None, then: tuple[Why | None, ...], tr: Translate = english) -> str:
    """`why` in words, and the last reason after it when there is one (`GPUs busy, then quota
    used up`)."""
    said = why_words(why, tr)
    for last in then:
        said = tr("{first}, then {last}").format(first=said, last=why_words(last, tr))
    return said


def cause_text(
    cause: Cause,
    why: str,
    recorded: Admission | None,
    replayed: Admission | None,
    tr: Translate = english,
) -> str:
    """Why the record and a replay differ for a job; `why` is the wait reason already written
    (`why_code` or `why_words`)."""
    if cause is Cause.ELSEWHERE:
        assert recorded is not None and replayed is not None
        return tr("placed on {replayed} instead of {recorded}").format(
            replayed=f"{replayed.pool}/{replayed.model}",
            recorded=f"{recorded.pool}/{recorded.model}",
        )
    return tr(CAUSES[cause]).format(why=why)
