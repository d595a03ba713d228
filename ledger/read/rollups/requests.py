"""What the dashboard shows of quota and budget requests (`ledger.admin.requests`): each request
in the sealed admin log with its status at a given time, newest first, for every team or one.
Read-only: requests are opened and decided with `tally request` or `/v1/requests`."""

from __future__ import annotations

from dataclasses import dataclass

from ledger.admin import AdminView
from ledger.admin.requests import change_text
from ledger.errors import LedgerError
from ledger.read.reports import ReportQueries
from ledger.store.side_files import load_admin_log


@dataclass(frozen=True, slots=True)
class RequestRow:
    request_id: str
    team: str
    status: str  # at the time asked for: an open request past its expiry is `expired`, one
    # whose latest decision the ledger refused `refused` (`RequestState.shown_at`)
    change: str
    requested_by: str
    reason: str
    approvers: str
    opened_us: int
    expires_us: int
    decided_by: str | None
    comment: str | None


@dataclass(frozen=True, slots=True)
class Requests:
    """`problem` says why the admin log could not be read (then `rows` is empty)."""

    rows: tuple[RequestRow, ...]
    problem: str | None = None


def requests(q: ReportQueries, now_us: int, team: str | None = None) -> Requests:
    try:
        view = AdminView.from_log(load_admin_log(q.root))
    except LedgerError as exc:
        return Requests((), str(exc))
    rows = [
        RequestRow(
            request_id=s.request_id,
            team=s.opened.team,
            status=s.shown_at(now_us),
            change=change_text(s.opened),
            requested_by=s.opened.actor,
            reason=s.opened.reason,
            approvers=", ".join(s.opened.approvers),
            opened_us=s.opened.effective_us,
            expires_us=s.opened.expires_us,
            decided_by=s.decided_by,
            comment=s.comment,
        )
        for s in view.requests.values()
        if team is None or s.opened.team == team
    ]
    rows.sort(key=lambda r: (r.opened_us, r.request_id), reverse=True)
    return Requests(tuple(rows))
