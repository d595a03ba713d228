"""What the self-service portal ("My jobs") shows and sends, as pure values: the saved job
templates (`$TALLY_JOB_TEMPLATES`, from `dashboard.job_templates`), the submission body a form
makes, and the rows of the jobs table — state, wait reason, GPU-hours and cost so far (integer
GPU-ms and micro-units, priced with the configuration's price book at the job's start) — from
the scheduler API's job views. No Streamlit and no HTTP here (`dashboard.portal_api` talks to
the API, `dashboard.page_portal` draws).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ledger.errors import PricingError
from ledger.job_events import WaitReason
from ledger.pricing import PriceBook, cost_of
from ledger.read.job_history import WAIT_SHORT
from ledger.read.texts import N_, Translate

TEMPLATES_ENV = "TALLY_JOB_TEMPLATES"  # tally.portal_config.TEMPLATES_ENV
US_PER_MS = 1000
SECONDS_PER_HOUR = 3600
ACTIVE = frozenset({"pending", "running"})  # the states a cancel still changes


@dataclass(frozen=True, slots=True)
class Template:
    """A saved submission (the form's starting values)."""

    name: str
    queue: str
    project: str
    gpus: int
    model: str | None
    estimated_runtime_hours: float
    command: tuple[str, ...]


def template_from_dict(t: Mapping[str, Any]) -> Template:
    """A template from its JSON form; KeyError, TypeError or ValueError if it is not one."""
    return Template(
        name=str(t["name"]),
        queue=str(t["queue"]),
        project=str(t["project"]),
        gpus=int(t["gpus"]),
        model=None if t.get("model") is None else str(t["model"]),
        estimated_runtime_hours=float(t["estimated_runtime_hours"]),
        command=tuple(str(a) for a in t["command"]),
    )


def template_dict(template: Template) -> dict[str, Any]:
    """The JSON form of `template` (what `template_from_dict` reads back)."""
    return {
        "name": template.name,
        "queue": template.queue,
        "project": template.project,
        "gpus": template.gpus,
        "model": template.model,
        "estimated_runtime_hours": template.estimated_runtime_hours,
        "command": list(template.command),
    }


def templates_from_json(text: str | None) -> tuple[Template, ...]:
    """The templates `tally` handed over; none for an absent or unreadable value."""
    if not text:
        return ()
    try:
        return tuple(template_from_dict(t) for t in json.loads(text))
    except (ValueError, TypeError, KeyError):
        return ()


def submit_body(template: Template, user: str) -> dict[str, Any]:
    """The `POST /v1/jobs` body for `template` as `user` (the API puts a team role's team)."""
    body: dict[str, Any] = {
        "project": template.project,
        "user": user,
        "queue": template.queue,
        "gpus": template.gpus,
        "command": list(template.command),
        "estimated_runtime_s": template.estimated_runtime_hours * SECONDS_PER_HOUR,
    }
    if template.model:
        body["model"] = template.model
    return body


def gpu_ms_so_far(job: Mapping[str, Any], now_us: int) -> int:
    """GPU-ms the job has held: its GPUs × the time from its start to its end (or now)."""
    started = job.get("started_us")
    if started is None:
        return 0
    ended = job.get("ended_us")
    until = now_us if ended is None else int(ended)
    return int(job["gpus"]) * max(0, until - int(started)) // US_PER_MS


def cost_so_far(job: Mapping[str, Any], gpu_ms: int, prices: PriceBook | None) -> int | None:
    """Micro-units for `gpu_ms` at the price of the job's model and pool when it started;
    None where that cannot be priced here (no price book, not yet placed, no price)."""
    assigned = job.get("assigned") or {}
    model, pool, started = assigned.get("model"), assigned.get("pool"), job.get("started_us")
    if prices is None or model is None or pool is None or started is None:
        return None if gpu_ms else 0
    try:
        return cost_of(gpu_ms, prices.rate_at(str(model), str(pool), int(started)))
    except PricingError:
        return None


# the API's job states (`scheduler.records.JobState`) in the ledger's words for them, translated
# where shown; a pending job is "waiting" (the requests' "pending" is another word: awaiting a
# decision)
JOB_STATES = {
    "pending": N_("waiting"),
    "running": N_("running"),
    "finished": N_("finished"),
    "failed": N_("failed"),
    "cancelled": N_("cancelled"),
    "reclaimed": N_("reclaimed"),
}
_PREEMPTED = "preempted: "  # a requeued job's reason until its next wait (`preempted: <code>`)


def _shown(code: str, english: str, tr: Translate) -> str:
    """`english` through `tr`; the API's own `code` where it stays English."""
    said = tr(english)
    return code if said == english else said


def state_shown(state: str, tr: Translate) -> str:
    """A job state from the API as the page shows it: as it is in English, else translated."""
    return _shown(state, JOB_STATES[state], tr) if state in JOB_STATES else state


def wait_shown(reason: str, tr: Translate) -> str:
    """A pending job's reason from the API (a `WaitReason` code, or `preempted: <code>`) in a
    few words of the session's language; as it is in English or when it is no code."""
    code = WaitReason.PREEMPTED.value if reason.startswith(_PREEMPTED) else reason
    try:
        wait = WaitReason(code)
    except ValueError:
        return reason
    return _shown(reason, WAIT_SHORT[wait], tr)


@dataclass(frozen=True, slots=True)
class JobRow:
    job_id: str
    user: str
    state: str
    wait_reason: str  # why a pending job waits ("" once it runs)
    queue: str
    gpus: int
    gpu_ms: int
    cost_micros: int | None
    cancellable: bool


def job_rows(
    jobs: Sequence[Mapping[str, Any]], now_us: int, prices: PriceBook | None
) -> list[JobRow]:
    """The jobs table, newest submission first."""
    rows = []
    for job in sorted(jobs, key=lambda j: (-int(j["submitted_us"]), str(j["job_id"]))):
        gpu_ms = gpu_ms_so_far(job, now_us)
        state = str(job["state"])
        rows.append(
            JobRow(
                job_id=str(job["job_id"]),
                user=str(job["user"]),
                state=state,
                wait_reason=str(job.get("reason") or "") if state == "pending" else "",
                queue=str(job["queue"]),
                gpus=int(job["gpus"]),
                gpu_ms=gpu_ms,
                cost_micros=cost_so_far(job, gpu_ms, prices),
                cancellable=state in ACTIVE,
            )
        )
    return rows


@dataclass(frozen=True, slots=True)
class Left:
    """What a team has left: budget per unit (granted, consumed, available) and quota."""

    budget: tuple[tuple[str, int, int, int], ...]  # (unit, granted, consumed, available)
    quota: tuple[tuple[str, str, int, int], ...]  # (pool, model, nominal, in use)


def left_of(balance: Mapping[str, Any]) -> Left:
    units = tuple(
        (str(u["unit"]), int(u["granted"]), int(u["consumed"]), int(u["available_to_admit"]))
        for u in balance.get("units", ())
    )
    quotas = tuple(
        (str(q["pool"]), str(q["model"]), int(q["nominal"]), int(q["in_use"]))
        for q in balance.get("quotas", ())
    )
    return Left(units, quotas)
