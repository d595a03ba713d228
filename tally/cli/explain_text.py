"""`tally job explain` in a language other than English: the explanation written on this side
from the job's events the API hands back (`Explanation.events`), by the reading the dashboard's
Team page shows (`ledger.read.job_history.explain_job`), through the CLI's catalog for the read
models' sentences (`tally.language.reader`), its times on the ledger's clock (`ledger.timezone`
of the configuration, UTC without one), named.

What is translated: the sentences and the codes in them (wait, stop and end reasons, states).
What stays as written: the scheduler's notes quoted from its events (free text, e.g. a
placement's or a wait's detail), names (jobs, teams, pools, GPU models) and the times' zone.
In English the command prints the scheduler's own explanation, unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, tzinfo
from typing import Any

import orjson

from ledger.errors import EventError
from ledger.job_events import JobEvent, decode_job_event
from ledger.read.job_history import explain_job, fold_jobs, job_teams, when_text


def decoded(events: Sequence[Mapping[str, Any]]) -> list[JobEvent]:
    """The API's envelopes as events; one that does not decode is left out."""
    out = []
    for envelope in events:
        try:
            out.append(decode_job_event(orjson.dumps(envelope)).data)
        except EventError:
            continue
    return out


def explanation_text(
    answer: Mapping[str, Any], tr: Callable[[str], str], zone: tzinfo = UTC
) -> str:
    """The explanation of `answer` (the API's) in `tr`'s language: where the job stands and
    why, what one can do, and its history a line per event."""
    events = decoded(answer.get("events") or ())
    job_id = str(answer["job_id"])
    teams = job_teams(fold_jobs(events)) if events else {}
    why = explain_job(job_id, events, int(answer.get("as_of_us") or 0), teams, tr, zone)
    lines = [why.headline]
    if why.advice:
        lines.append(why.advice)
    if why.timeline:
        lines.append("")
        lines += [f"{when_text(t.time_us, zone)}  {t.text}" for t in why.timeline]
    return "\n".join(lines)
