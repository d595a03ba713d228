"""The words of a what-if report's comparison rows: each metric's and scope's name for people.

Shared by the scheduler's report (`scheduler.whatif.texts`) and the dashboard's reading of a
saved one (`dashboard.whatif_text`), which may not import the scheduler; in the reader's
language through a `Translate` (`ledger.read.texts`), English by default.
"""

from __future__ import annotations

from ledger.read.texts import N_, Translate, english

METRICS = {
    "gpu_hours": N_("GPU-hours"),
    "cost": N_("Cost"),
    "wait_p50": N_("p50 wait"),
    "wait_p95": N_("p95 wait"),
    "utilisation": N_("Utilisation"),
    "preemptions": N_("Preemptions"),
    "gpu_hours_lost": N_("GPU-hours lost to preemptions"),
    "jain_fairness": N_("Jain's fairness index"),
    "budget_overrun": N_("Budget overrun"),
}
SCOPES = {"all": N_("all jobs"), "fleet": N_("the fleet"), "teams": N_("all teams")}
SCOPE_KINDS = {"team": N_("team {name}"), "queue": N_("queue {name}")}


def metric_name(code: str, tr: Translate = english) -> str:
    """A comparison row's metric (`wait_p95`) in words (`p95 wait`); an unknown code as it is."""
    return tr(METRICS[code]) if code in METRICS else code


def scope_name(scope: str, tr: Translate = english) -> str:
    """A comparison row's scope (`all`, `team:vision`) in words (`all jobs`, `team vision`)."""
    if scope in SCOPES:
        return tr(SCOPES[scope])
    kind, sep, name = scope.partition(":")
    return tr(SCOPE_KINDS[kind]).format(name=name) if sep and kind in SCOPE_KINDS else scope
