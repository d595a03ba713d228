"""Who is calling: bearer tokens (`Tokens`), the caller they name (`Principal`, a
`ledger.roles.Caller`: a role, its team, its user), `authenticate`, which answers 401 for a
missing or unknown token (a token shaped as a JWT goes to the OIDC verifier when one is
configured, `scheduler.api.oidc`; every other token is a static one), and `authorize`, which
answers 403 for an action the caller's role may not do and 404 for another team's object
(`ledger.roles.decide`). A static token is found by its SHA-256 digest in an index built with
the `Tokens` (they live as long as it: a token removed from the configuration is gone when the
service restarts with it), so a lookup's time tells nothing of the token — what it could
reveal is a digest's hash, never the token's characters — and does not grow with the number
of tokens. Tokens are never logged; the access log names the principal (`admin`,
`team:<name>`, `<role>:<token name>`, `<role>:oidc:<user>`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field

from aiohttp import web

from ledger.roles import Action, Caller, Decision, Role, decide
from scheduler.api.oidc import OidcVerifier, looks_like_jwt
from scheduler.api.responses import ApiError

PRINCIPAL_KEY = web.RequestKey("principal", str)  # the principal's name, for the access log


Principal = Caller  # who is calling, as the API knows it


@dataclass(frozen=True, slots=True)
class Tokens:
    """The bearer tokens: the admin's, one per team (that team's `team-lead`), and named
    tokens with any role (`named`: token → caller). Any of them may be missing."""

    admin: str | None = None
    teams: Mapping[str, str] = field(default_factory=dict)
    named: Mapping[str, Caller] = field(default_factory=dict)
    _by_digest: Mapping[bytes, Caller] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # a secret given twice names the caller listed last, as a scan of `every` would
        index = {_digest(secret): caller for secret, caller in self.every()}
        object.__setattr__(self, "_by_digest", index)

    def every(self) -> list[tuple[str, Caller]]:
        """Every (token, caller) pair, the admin's first."""
        pairs = [(self.admin, Caller(Role.ADMIN))] if self.admin else []
        pairs += [(t, Caller(Role.TEAM_LEAD, team)) for team, t in sorted(self.teams.items())]
        pairs += sorted(self.named.items(), key=lambda pair: pair[1].name)
        return pairs

    def principal(self, token: str) -> Principal | None:
        """Who `token` belongs to: looked up by its digest (see the module)."""
        return self._by_digest.get(_digest(token))


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()


async def authenticate(
    request: web.Request, tokens: Tokens, oidc: OidcVerifier | None = None
) -> Principal:
    """The caller of `request`; raises ApiError(401) without a valid bearer token (from the
    OIDC verifier also 403: a person with no role, 503: the issuer's keys cannot be had)."""
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if not header:
        raise ApiError(401, "a bearer token is required (Authorization: Bearer <token>)")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, "the Authorization header must be `Bearer <token>`")
    token = token.strip()
    if oidc is not None and looks_like_jwt(token):
        principal: Principal | None = await oidc.caller(token)
    else:
        principal = tokens.principal(token)
    if principal is None:
        raise ApiError(401, "the token is not valid")
    request[PRINCIPAL_KEY] = principal.name
    return principal


def authorize(
    principal: Principal,
    action: Action,
    team: str | None = None,
    user: str | None = None,
    missing: str = "not found",
) -> None:
    """Raise ApiError 403 if `principal` may not do `action` (to an object of `team` and
    `user`), 404 (`missing`, the answer for an object that does not exist) if the object is
    another team's."""
    decision = decide(principal, action, team, user)
    if decision is Decision.HIDDEN:
        raise ApiError(404, missing)
    if decision is Decision.FORBIDDEN:
        if team is None or decide(principal, action) is Decision.FORBIDDEN:
            raise ApiError(403, f"role {principal.role} may not {action}")
        raise ApiError(403, f"role {principal.role} may {action} only for user {principal.user}")
