"""Who may do what: the roles (`Role`), the actions of the API and of the admin topic
(`Action`), and the permission table (`PERMISSIONS`) that the API, the CLI and the ledger all
enforce — one table, as data. Pure: `decide` takes a caller and an action and returns a
`Decision`; `admin_event_refusal` says why an admin event's recorded role may not make it.

Scopes: `any` (every team's objects), `team` (the caller's team's objects only) and `own`
(the caller's team's objects that name the caller's user). An object outside the caller's
scope is answered as if it did not exist (404), an action the role may not do at all is
refused (403). The README's permission table is `permissions_markdown()` (a test keeps them
equal).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum, StrEnum

from ledger.invalid import Invalid


class Role(StrEnum):
    """A caller's role. `team-lead` and `member` belong to one team; the others are
    organisation-wide."""

    ADMIN = "admin"
    FINANCE = "finance"
    OPERATOR = "operator"
    TEAM_LEAD = "team-lead"
    MEMBER = "member"
    VIEWER = "viewer"

    @property
    def per_team(self) -> bool:
        return self in TEAM_ROLES


TEAM_ROLES = frozenset({Role.TEAM_LEAD, Role.MEMBER})


class Scope(StrEnum):
    """Whose objects an allowed action reaches."""

    ANY = "any"  # every team's
    TEAM = "team"  # the caller's team's
    OWN = "own"  # the caller's team's, and only those that name the caller's user


class Action(StrEnum):
    """Everything the permission table decides: API actions (`jobs.*`, `queues.read`,
        `balances.read`, `inventory.read`, `requests.*`) and admin-topic events (the rest;
    `requests.open` and `requests.decide` are both).  Who may decide a given request is narrower
    than `requests.decide`: the approval policy (`ledger.admin.requests`) names the roles, and
    nobody decides their own request."""

    JOB_SUBMIT = "jobs.submit"
    JOB_READ = "jobs.read"  # list, show, explain
    JOB_CANCEL = "jobs.cancel"
    QUEUES_READ = "queues.read"
    BALANCES_READ = "balances.read"
    INVENTORY_READ = "inventory.read"
    BUDGET_GRANT = "budget.grant"  # one-off grants and recurring budget policies
    PRICE_SET = "price.set"
    TEAM_DEFINE = "team.define"
    QUOTA_SET = "quota.set"
    LEDGER_ADJUST = "ledger.adjust"  # adjustments and reversals
    PERIOD_CLOSE = "period.close"
    GPU_CORDON = "gpu.cordon"  # cordon and uncordon
    REQUEST_OPEN = "requests.open"  # ask for a quota or budget change
    REQUEST_READ = "requests.read"
    REQUEST_DECIDE = "requests.decide"  # approve, reject, expire (the policy narrows who)


_A, _T, _O = Scope.ANY, Scope.TEAM, Scope.OWN
_EVERYONE = {r: _A for r in Role}
_ORG_WIDE = (Role.ADMIN, Role.FINANCE, Role.OPERATOR, Role.VIEWER)

# The table. A role missing from an action's row may not do it at all.
PERMISSIONS: Mapping[Action, Mapping[Role, Scope]] = {
    Action.JOB_SUBMIT: {Role.ADMIN: _A, Role.TEAM_LEAD: _T, Role.MEMBER: _O},
    Action.JOB_READ: {**{r: _A for r in _ORG_WIDE}, Role.TEAM_LEAD: _T, Role.MEMBER: _T},
    Action.JOB_CANCEL: {Role.ADMIN: _A, Role.TEAM_LEAD: _T, Role.MEMBER: _O},
    Action.QUEUES_READ: _EVERYONE,
    Action.BALANCES_READ: {
        Role.ADMIN: _A,
        Role.FINANCE: _A,
        Role.VIEWER: _A,
        Role.TEAM_LEAD: _T,
        Role.MEMBER: _T,
    },
    Action.INVENTORY_READ: _EVERYONE,
    Action.BUDGET_GRANT: {Role.ADMIN: _A, Role.FINANCE: _A},
    Action.PRICE_SET: {Role.ADMIN: _A, Role.FINANCE: _A},
    Action.TEAM_DEFINE: {Role.ADMIN: _A},
    Action.QUOTA_SET: {Role.ADMIN: _A},
    Action.LEDGER_ADJUST: {Role.ADMIN: _A, Role.FINANCE: _A},
    Action.PERIOD_CLOSE: {Role.ADMIN: _A, Role.FINANCE: _A},
    Action.GPU_CORDON: {Role.ADMIN: _A, Role.OPERATOR: _A},
    Action.REQUEST_OPEN: {Role.ADMIN: _A, Role.TEAM_LEAD: _T, Role.MEMBER: _T},
    Action.REQUEST_READ: {**{r: _A for r in _ORG_WIDE}, Role.TEAM_LEAD: _T, Role.MEMBER: _T},
    Action.REQUEST_DECIDE: {Role.ADMIN: _A, Role.FINANCE: _A, Role.OPERATOR: _A},
}


@dataclass(frozen=True, slots=True)
class Caller:
    """Who is calling: a role, the team of a team role, the user of a member (whose jobs are
    its own), and a name for logs and idempotency scopes."""

    role: Role
    team: str | None = None
    user: str | None = None
    label: str | None = None  # a named token's name

    def __post_init__(self) -> None:
        if self.role.per_team and self.team is None:
            raise Invalid("role {role} needs a team", role=str(self.role))
        if not self.role.per_team and self.team is not None:
            raise Invalid("role {role} is organisation-wide: no team", role=str(self.role))
        if self.role is Role.MEMBER and self.user is None:
            raise Invalid("role member needs a user")

    @property
    def name(self) -> str:
        """`admin` (the admin token), `team:<team>` (a team token), or `<role>:<label>`."""
        if self.label is not None:
            return f"{self.role}:{self.label}"
        if self.role is Role.ADMIN:
            return "admin"
        if self.role is Role.TEAM_LEAD:
            return f"team:{self.team}"
        return f"{self.role}:{self.team or '-'}:{self.user or '-'}"


class Decision(Enum):
    """The answer to "may this caller do this to this object?"."""

    ALLOWED = "allowed"
    FORBIDDEN = "forbidden"  # the role may not do this at all, or not to this object: 403
    HIDDEN = "hidden"  # the object is another team's: answered as missing, 404


def scope_of(role: Role, action: Action) -> Scope | None:
    """How far `role` may do `action`; None: not at all."""
    return PERMISSIONS[action].get(role)


def decide(
    caller: Caller, action: Action, team: str | None = None, user: str | None = None
) -> Decision:
    """May `caller` do `action` — on an object of `team` (and `user`), when it has one?"""
    scope = scope_of(caller.role, action)
    if scope is None:
        return Decision.FORBIDDEN
    if scope is Scope.ANY or team is None:
        return Decision.ALLOWED
    if team != caller.team:
        return Decision.HIDDEN
    if scope is Scope.OWN and user != caller.user:
        return Decision.FORBIDDEN
    return Decision.ALLOWED


def may(role: Role, action: Action) -> bool:
    """Whether `role` may do `action` at all (on some object)."""
    return scope_of(role, action) is not None


def admin_event_refusal(action: Action, role: Role | None) -> str | None:
    """Why an admin event of `action` recorded with `role` is refused, or None. An event
    without a role is the local operator's (see docs/architecture.md, "Roles"): allowed."""
    if role is None or may(role, action):
        return None
    return f"role {role} may not {action} (allowed: {', '.join(sorted(PERMISSIONS[action]))})"


def permissions_markdown() -> str:
    """The permission table as the README shows it: an action per row, a role per column;
    `all` (every team), `team` (own team), `own` (own jobs), `—` (refused)."""
    roles = list(Role)
    shown = {Scope.ANY: "all", Scope.TEAM: "team", Scope.OWN: "own"}
    lines = [
        "| action | " + " | ".join(roles) + " |",
        "|---|" + "---|" * len(roles),
    ]
    for action in Action:
        cells = [shown[s] if (s := scope_of(r, action)) else "—" for r in roles]
        lines.append(f"| `{action}` | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
