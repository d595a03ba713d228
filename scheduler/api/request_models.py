"""The bodies of the requests routes (`/v1/requests`, `scheduler.api.request_handlers`): a
quota or budget request, an approver's decision, the list query, and a request as the API
shows it. Strict like every model of `scheduler.api.models`."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ledger.admin import MAX_REASON
from scheduler.api.models import Name, Request, Response

Reason = Field(min_length=1, max_length=MAX_REASON)
MONEY_PATTERN = r"^-?[0-9]{1,15}(\.[0-9]{1,6})?$"
PERIOD_PATTERN = r"^[0-9]{4}-(0[1-9]|1[0-2])$"
GPUS = Field(None, ge=0, le=1_000_000)


class RequestBody(Request):
    """Ask for a change for `team` (required with an organisation-wide token): a budget
    (`period` and one of `money`, decimal text, or `gpu_hours`; negative gives budget back) or
    a whole quota (`pool`, `model`, `gpus`; a limit left out is unlimited)."""

    kind: Literal["budget", "quota"]
    team: Name | None = None
    reason: str = Reason
    period: str | None = Field(None, pattern=PERIOD_PATTERN)
    money: str | None = Field(None, pattern=MONEY_PATTERN)
    gpu_hours: int | None = Field(None, ge=-1_000_000_000, le=1_000_000_000)
    pool: Name | None = None
    model: Name | None = None
    gpus: int | None = GPUS
    borrowing_limit: int | None = GPUS
    lending_limit: int | None = GPUS


class DecisionBody(Request):
    """An approval or rejection, with the comment the requester reads."""

    comment: str = Reason


class RequestsQuery(BaseModel):
    """`GET /v1/requests`: a team (a team role: its own only) and a status."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    team: Name | None = None
    status: Literal["open", "approved", "rejected", "expired", "refused"] | None = None


class RequestView(Response):
    """A request: what it asks (`change`, in the ledger's integers), who asked and why, who may
    approve it, its status now (an open one past `expires_us` is `expired`; `refused` while the
    ledger refused its latest decision — e.g. an approval whose grant fell in a closed period —
    with the ledger's reason in `refused_reason`: the request is open again and may be decided
    anew) and, once decided, who decided, as what, when, with which comment, and the admin
    event an approval made."""

    request_id: str
    team: str
    kind: str
    status: str
    change: str
    requested_by: str
    requested_role: str
    reason: str
    approvers: list[str]
    opened_us: int
    expires_us: int
    decided_by: str | None
    decided_role: str | None
    decided_us: int | None
    comment: str | None
    effect: str | None
    refused_reason: str | None = None


class RequestAnswer(Response):
    request: RequestView


class RequestsList(Response):
    requests: list[RequestView]
