"""What the Requests page (`dashboard.page_requests`) sends and shows, as pure values: the
`POST /v1/requests` body a quota or budget request form makes (only the fields its kind needs;
a problem sentence instead of a body the API would refuse for its shape), and the rows of the
requests table from the API's request views — status as a person reads it (an open request is
"pending"; an approval names the admin event the ledger applies), money in the ledger's
micro-units written as an amount. Who may open, read and decide is the API's (its permission
table and approval policy); nothing here decides it. No Streamlit and no HTTP here.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from ledger.read.texts import Translate, english

MONEY = re.compile(r"^-?[0-9]{1,15}(\.[0-9]{1,6})?$")  # the API's MONEY_PATTERN
PERIOD = re.compile(r"^[0-9]{4}-(0[1-9]|1[0-2])$")
MICROS = 1_000_000
MS_PER_HOUR = 3_600_000
PENDING = "pending"
SHOWN_STATUS = {"open": PENDING}  # the API's "open" is what a requester calls pending
Money = Callable[[int], str]  # micro-units → an amount as shown
_BUDGET_CHANGE = re.compile(r"^budget (\S+) (money_micros|gpu_ms) ([+-][0-9]+)$")
_QUOTA_CHANGE = re.compile(r"^quota (\S+) ([0-9]+) GPUs \(borrowing (\S+), lending (\S+)\)$")
UNLIMITED = "unlimited"


@dataclass(frozen=True, slots=True)
class RequestForm:
    """The form's values as typed: `amount` is money text (budget in money), whole GPU-hours
    (budget in GPU-hours) or unused (quota); limits empty for unlimited."""

    kind: str  # "budget" | "quota"
    team: str
    reason: str
    period: str = ""
    unit: str = "money"  # "money" | "gpu_hours"
    amount: str = ""
    pool: str = ""
    model: str = ""
    gpus: int = 0
    borrowing_limit: str = ""
    lending_limit: str = ""


def N_(message: str) -> str:
    """Marks a problem for the catalog (`dashboard.i18n`); the page translates it where shown."""
    return message


STATUS_LABELS = {  # a row's status → its label (translated where shown)
    PENDING: N_("pending"),
    "approved": N_("approved"),
    "rejected": N_("rejected"),
    "expired": N_("expired"),
    "refused": N_("refused by the ledger"),
}
NO_REASON = N_("Reason: say why the change is needed.")
BAD_PERIOD = N_("Period: a month as YYYY-MM.")
BAD_MONEY = N_("Amount: a non-zero amount such as 500 or -120.50.")
BAD_HOURS = N_("Amount: a non-zero whole number of GPU-hours.")
BAD_KIND = N_("Kind: budget or quota.")
NO_POOL = N_("Pool and model: both needed for a quota.")
BAD_LIMIT = N_("Limits: a whole number of GPUs, or empty for unlimited.")


def request_body(form: RequestForm) -> dict[str, Any] | str:
    """The request body for `form`, or what is wrong with it (one of the messages above)."""
    reason = form.reason.strip()
    if not reason:
        return NO_REASON
    body: dict[str, Any] = {"kind": form.kind, "team": form.team, "reason": reason}
    if form.kind == "budget":
        period, amount = form.period.strip(), form.amount.strip()
        if not PERIOD.match(period):
            return BAD_PERIOD
        body["period"] = period
        if form.unit == "money":
            if not MONEY.match(amount) or Decimal(amount) == 0:
                return BAD_MONEY
            body["money"] = amount
            return body
        if not re.fullmatch(r"-?[0-9]{1,10}", amount) or int(amount) == 0:
            return BAD_HOURS
        body["gpu_hours"] = int(amount)
        return body
    if form.kind != "quota":
        return BAD_KIND
    if not form.pool.strip() or not form.model.strip():
        return NO_POOL
    body |= {"pool": form.pool.strip(), "model": form.model.strip(), "gpus": form.gpus}
    for key in ("borrowing_limit", "lending_limit"):
        text = getattr(form, key).strip()
        if text:
            if not text.isdigit() or len(text) > 7:
                return BAD_LIMIT
            body[key] = int(text)
    return body


def change_shown(change: str, money: Money | None = None, tr: Translate = english) -> str:
    """The API's change line with its integers as a person reads them: a money budget in
    currency units (`money` formats micro-units; default: plain decimal), GPU-ms in GPU-hours;
    its words in `tr`'s language (a line of another shape as it is)."""
    quota = _QUOTA_CHANGE.match(change)
    if quota is not None:
        borrowing, lending = (
            tr("unlimited") if v == UNLIMITED else v for v in (quota.group(3), quota.group(4))
        )
        return tr("quota {where} {gpus} GPUs (borrowing {borrowing}, lending {lending})").format(
            where=quota.group(1), gpus=quota.group(2), borrowing=borrowing, lending=lending
        )
    found = _BUDGET_CHANGE.match(change)
    if found is None:
        return change
    period, unit, amount = found.group(1), found.group(2), int(found.group(3))
    sign = "+" if amount > 0 else "-"
    if unit == "money_micros":
        text = money(abs(amount)) if money else str(Decimal(abs(amount)) / MICROS)
    else:
        text = f"{Decimal(abs(amount)) / MS_PER_HOUR:f} GPU-h"
    return tr("budget {period} {amount}").format(period=period, amount=sign + text)


@dataclass(frozen=True, slots=True)
class RequestRow:
    request_id: str
    team: str
    kind: str
    change: str
    status: str  # pending | approved | rejected | expired | refused (by the ledger: open again)
    requested_by: str
    reason: str
    approvers: str  # the roles that may decide it, e.g. "finance, admin"
    opened_us: int
    decided_by: str  # "" while undecided; "bo (finance)" once decided
    comment: str
    effect: str  # the admin event an approval made ("" otherwise)
    decidable: bool  # still open: an approver may approve or reject it
    refused_reason: str = ""  # why the ledger refused the approval ("" unless refused)


def request_rows(
    views: Sequence[Mapping[str, Any]], money: Money | None = None, tr: Translate = english
) -> list[RequestRow]:
    """The requests table, newest first; `money` formats micro-units, `tr` is the reader's
    language (see `change_shown`)."""
    rows = []
    for v in sorted(views, key=lambda v: (-int(v["opened_us"]), str(v["request_id"]))):
        status = str(v["status"])
        decided_by = v.get("decided_by") or ""
        if decided_by and v.get("decided_role"):
            decided_by = f"{decided_by} ({v['decided_role']})"
        rows.append(
            RequestRow(
                request_id=str(v["request_id"]),
                team=str(v["team"]),
                kind=str(v["kind"]),
                change=change_shown(str(v["change"]), money, tr),
                status=SHOWN_STATUS.get(status, status),
                requested_by=str(v["requested_by"]),
                reason=str(v["reason"]),
                approvers=", ".join(str(a) for a in v.get("approvers", ())),
                opened_us=int(v["opened_us"]),
                decided_by=str(decided_by),
                comment=str(v.get("comment") or ""),
                effect=str(v.get("effect") or "") if status == "approved" else "",
                decidable=status in ("open", "refused"),
                refused_reason=str(v.get("refused_reason") or "") if status == "refused" else "",
            )
        )
    return rows


def status_text(row: RequestRow, tr: Translate = english) -> str:
    """A row's status as shown: its label, with the ledger's reason when it refused."""
    label = tr(STATUS_LABELS.get(row.status, row.status))
    return f"{label}: {row.refused_reason}" if row.refused_reason else label


def status_counts(rows: Sequence[RequestRow]) -> dict[str, int]:
    """How many requests have each status, in the order a reader scans them."""
    order = (PENDING, "refused", "approved", "rejected", "expired")
    counts = {s: 0 for s in order}
    for row in rows:
        counts[row.status] = counts.get(row.status, 0) + 1
    return {s: n for s, n in counts.items() if n}
