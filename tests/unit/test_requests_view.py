"""The Requests page's pure parts (`dashboard.requests_view`): the `POST /v1/requests` body a
form makes (only its kind's fields; a problem instead of a body the API would refuse for its
shape), the API's change lines with money and GPU-hours as a person reads them, and the rows of
the requests table (pending for open, who decided as what, the admin event an approval made).
The bodies the form makes are then taken by the API's own model."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from dashboard.requests_view import (
    BAD_HOURS,
    BAD_KIND,
    BAD_LIMIT,
    BAD_MONEY,
    BAD_PERIOD,
    NO_POOL,
    NO_REASON,
    RequestForm,
    RequestRow,
    change_shown,
    request_body,
    request_rows,
    status_counts,
    status_text,
)
from scheduler.api.request_models import RequestBody

BUDGET = RequestForm("budget", "vision", "more runs", period="2026-12", amount="500")
QUOTA = RequestForm("quota", "vision", "a new lab", pool="h100", model="H100", gpus=8)


@pytest.mark.parametrize(
    ("form", "body"),
    [
        pytest.param(
            BUDGET,
            {"kind": "budget", "team": "vision", "reason": "more runs", "period": "2026-12",
             "money": "500"},
            id="budget-money",
        ),
        pytest.param(
            replace(BUDGET, amount="-120.50", reason="  give back  "),
            {"kind": "budget", "team": "vision", "reason": "give back", "period": "2026-12",
             "money": "-120.50"},
            id="budget-money-given-back-reason-trimmed",
        ),
        pytest.param(
            replace(BUDGET, unit="gpu_hours", amount="40"),
            {"kind": "budget", "team": "vision", "reason": "more runs", "period": "2026-12",
             "gpu_hours": 40},
            id="budget-gpu-hours",
        ),
        pytest.param(
            QUOTA,
            {"kind": "quota", "team": "vision", "reason": "a new lab", "pool": "h100",
             "model": "H100", "gpus": 8},
            id="quota-unlimited-limits-left-out",
        ),
        pytest.param(
            replace(QUOTA, borrowing_limit="4", lending_limit=" 0 "),
            {"kind": "quota", "team": "vision", "reason": "a new lab", "pool": "h100",
             "model": "H100", "gpus": 8, "borrowing_limit": 4, "lending_limit": 0},
            id="quota-with-limits",
        ),
    ],
)  # fmt: skip
def test_a_form_makes_the_body_the_api_takes(form, body):
    assert request_body(form) == body
    RequestBody.model_validate(body)  # the API's own model takes it


@pytest.mark.parametrize(
    ("form", "problem"),
    [
        pytest.param(replace(BUDGET, reason="  "), NO_REASON, id="no-reason"),
        pytest.param(replace(BUDGET, period="2026-13"), BAD_PERIOD, id="month-13"),
        pytest.param(replace(BUDGET, period="Dec"), BAD_PERIOD, id="not-a-month"),
        pytest.param(replace(BUDGET, amount="0.00"), BAD_MONEY, id="zero-money"),
        pytest.param(replace(BUDGET, amount="1.2345678"), BAD_MONEY, id="money-past-micros"),
        pytest.param(replace(BUDGET, amount="lots"), BAD_MONEY, id="money-not-a-number"),
        pytest.param(replace(BUDGET, unit="gpu_hours", amount="1.5"), BAD_HOURS, id="part-hours"),
        pytest.param(replace(BUDGET, unit="gpu_hours", amount="0"), BAD_HOURS, id="zero-hours"),
        pytest.param(replace(QUOTA, pool=" "), NO_POOL, id="quota-without-pool"),
        pytest.param(replace(QUOTA, borrowing_limit="-1"), BAD_LIMIT, id="negative-limit"),
        pytest.param(replace(QUOTA, lending_limit="two"), BAD_LIMIT, id="limit-not-a-number"),
        pytest.param(replace(QUOTA, kind="gpus"), BAD_KIND, id="unknown-kind"),
    ],
)
def test_a_form_the_api_would_refuse_says_why(form, problem):
    assert request_body(form) == problem


@pytest.mark.parametrize(
    ("change", "shown"),
    [
        ("budget 2026-12 money_micros +500000000", "budget 2026-12 +500"),
        ("budget 2026-12 money_micros -120500000", "budget 2026-12 -120.5"),
        ("budget 2026-12 gpu_ms +144000000", "budget 2026-12 +40 GPU-h"),
        ("budget 2026-12 gpu_ms -1800000", "budget 2026-12 -0.5 GPU-h"),
        (
            "quota h100/H100 8 GPUs (borrowing unlimited, lending 0)",
            "quota h100/H100 8 GPUs (borrowing unlimited, lending 0)",
        ),
    ],
    ids=["money-up", "money-back", "gpu-hours-up", "gpu-hours-back", "quota-as-is"],
)
def test_changes_as_a_person_reads_them(change, shown):
    assert change_shown(change) == shown


def test_money_is_formatted_by_the_page_when_given():
    shown = change_shown("budget 2026-12 money_micros +500000000", lambda m: f"${m // 10**6}.00")
    assert shown == "budget 2026-12 +$500.00"


def a_view(**overrides: Any) -> dict[str, Any]:
    view: dict[str, Any] = {
        "request_id": "req-1",
        "team": "vision",
        "kind": "budget",
        "status": "open",
        "change": "budget 2026-12 money_micros +500000000",
        "requested_by": "lee",
        "requested_role": "team-lead",
        "reason": "more runs",
        "approvers": ["finance", "admin"],
        "opened_us": 100,
        "expires_us": 200,
        "decided_by": None,
        "decided_role": None,
        "decided_us": None,
        "comment": None,
        "effect": None,
    }
    return view | overrides


def a_row(**overrides: Any) -> RequestRow:
    row = RequestRow(
        request_id="req-1", team="vision", kind="budget", change="budget 2026-12 +500",
        status="pending", requested_by="lee", reason="more runs", approvers="finance, admin",
        opened_us=100, decided_by="", comment="", effect="", decidable=True,
    )  # fmt: skip
    return replace(row, **overrides)


DECIDED = {"decided_by": "bo", "decided_role": "finance", "decided_us": 150, "comment": "ok"}


@pytest.mark.parametrize(
    ("view", "row"),
    [
        pytest.param(a_view(), a_row(), id="open-is-pending-and-decidable"),
        pytest.param(
            a_view(status="approved", effect="adm-9", **DECIDED),
            a_row(status="approved", decided_by="bo (finance)", comment="ok", effect="adm-9",
                  decidable=False),
            id="approved-names-its-admin-event",
        ),
        pytest.param(
            a_view(status="rejected", **DECIDED),
            a_row(status="rejected", decided_by="bo (finance)", comment="ok", decidable=False),
            id="rejected",
        ),
        pytest.param(
            a_view(status="expired"), a_row(status="expired", decidable=False), id="expired"
        ),
        pytest.param(
            a_view(status="refused", effect="adm-9", refused_reason="period 2026-11 is closed",
                   **DECIDED),
            a_row(status="refused", decided_by="bo (finance)", comment="ok",
                  refused_reason="period 2026-11 is closed"),
            id="refused-by-the-ledger-is-open-again-with-its-reason",
        ),
    ],
)  # fmt: skip
def test_request_rows(view, row):
    assert request_rows([view]) == [row]


def test_rows_newest_first_and_counted_by_status():
    rows = request_rows(
        [
            a_view(request_id="a", opened_us=1, status="expired"),
            a_view(request_id="b", opened_us=3),
            a_view(request_id="c", opened_us=2, status="approved", effect="e"),
            a_view(request_id="d", opened_us=3),
            a_view(request_id="e", opened_us=0, status="refused", refused_reason="closed"),
        ]
    )
    assert [r.request_id for r in rows] == ["b", "d", "c", "a", "e"]
    assert status_counts(rows) == {"pending": 2, "refused": 1, "approved": 1, "expired": 1}


@pytest.mark.parametrize(
    ("row", "shown"),
    [
        pytest.param(a_row(), "PENDING", id="pending"),
        pytest.param(a_row(status="approved"), "APPROVED", id="approved"),
        pytest.param(
            a_row(status="refused", refused_reason="period 2026-11 is closed"),
            "REFUSED BY THE LEDGER: period 2026-11 is closed",
            id="refused-says-the-ledgers-reason",
        ),
    ],
)
def test_status_as_shown_in_the_language(row, shown):
    assert status_text(row, str.upper) == shown
