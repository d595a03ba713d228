"""The request events of the `admin` topic: a team asks for a budget or quota change
(`RequestOpened`), and an approver approves (`RequestApproved`) or rejects it
(`RequestRejected`), or it expires (`RequestExpired`). Frozen and slotted; every step is keyed
by the request's id. What they mean and how they fold: `ledger.admin.requests`."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar

from ledger.admin.kinds import AdminKind
from ledger.roles import Role
from ledger.units import Unit


class RequestKind(StrEnum):
    BUDGET = "budget"
    QUOTA = "quota"


class RequestStatus(StrEnum):
    OPEN = "open"
    APPROVED = "approved"
    REJECTED = "rejected"
    EXPIRED = "expired"


@dataclass(frozen=True, slots=True)
class RequestOpened:
    """`team` asks for a change: a budget grant (`period`, `unit`, signed `amount`) or a quota
    (`pool`, `model`, `nominal_gpus`, `borrowing_limit`, `lending_limit`: the whole quota, as
    `QuotaSet` writes it; a limit of None is unlimited). `approvers`: the roles that may approve
    it; `expires_us`: from then on it can only expire."""

    KIND: ClassVar[AdminKind] = AdminKind.REQUEST_OPENED
    request_id: str
    team: str
    kind: RequestKind
    approvers: tuple[str, ...]
    expires_us: int
    actor: str
    reason: str
    effective_us: int
    period: str | None = None
    unit: Unit | None = None
    amount: int | None = None
    pool: str | None = None
    model: str | None = None
    nominal_gpus: int | None = None
    borrowing_limit: int | None = None
    lending_limit: int | None = None
    role: Role | None = None  # the role the writer acted in (None: the local operator)

    @property
    def entity(self) -> str:
        return self.request_id


@dataclass(frozen=True, slots=True)
class RequestApproved:
    """`actor` approves `request_id`; `reason` is the comment."""

    KIND: ClassVar[AdminKind] = AdminKind.REQUEST_APPROVED
    request_id: str
    actor: str
    reason: str
    effective_us: int
    role: Role | None = None

    @property
    def entity(self) -> str:
        return self.request_id


@dataclass(frozen=True, slots=True)
class RequestRejected:
    """`actor` rejects `request_id`; `reason` is the comment."""

    KIND: ClassVar[AdminKind] = AdminKind.REQUEST_REJECTED
    request_id: str
    actor: str
    reason: str
    effective_us: int
    role: Role | None = None

    @property
    def entity(self) -> str:
        return self.request_id


@dataclass(frozen=True, slots=True)
class RequestExpired:
    """`request_id` was still open at its expiry; written by `tally request expire` (any time at
    or after `expires_us`)."""

    KIND: ClassVar[AdminKind] = AdminKind.REQUEST_EXPIRED
    request_id: str
    actor: str
    reason: str
    effective_us: int
    role: Role | None = None

    @property
    def entity(self) -> str:
        return self.request_id


RequestEvent = RequestOpened | RequestApproved | RequestRejected | RequestExpired
REQUEST_CLASSES = (RequestOpened, RequestApproved, RequestRejected, RequestExpired)
