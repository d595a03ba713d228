"""Who is calling: bearer tokens (`Tokens`), the caller they name (`Principal`) and
`authenticate`, which answers 401 for a missing or unknown token. Tokens are compared in
constant time and never logged; the access log names the principal (`admin`, `team:<name>`).
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from dataclasses import dataclass, field

from aiohttp import web

from scheduler.api.responses import ApiError

PRINCIPAL_KEY = web.RequestKey("principal", str)  # the principal's name, for the access log


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: a team, or the admin (team None)."""

    team: str | None

    @property
    def is_admin(self) -> bool:
        return self.team is None

    @property
    def name(self) -> str:
        """`admin` or `team:<name>`: the scope of its idempotency keys, in the access log."""
        return "admin" if self.team is None else f"team:{self.team}"


@dataclass(frozen=True, slots=True)
class Tokens:
    """The bearer tokens: the admin's and one per team (either may be missing)."""

    admin: str | None = None
    teams: Mapping[str, str] = field(default_factory=dict)

    def principal(self, token: str) -> Principal | None:
        """Who `token` belongs to; every known token is compared, in constant time."""
        given = token.encode("utf-8", "surrogateescape")
        found: Principal | None = None
        if self.admin and hmac.compare_digest(given, self.admin.encode()):
            found = Principal(None)
        for team, secret in sorted(self.teams.items()):
            if hmac.compare_digest(given, secret.encode()):
                found = Principal(team)
        return found


def authenticate(request: web.Request, tokens: Tokens) -> Principal:
    """The caller of `request`; raises ApiError(401) without a valid bearer token."""
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if not header:
        raise ApiError(401, "a bearer token is required (Authorization: Bearer <token>)")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, "the Authorization header must be `Bearer <token>`")
    principal = tokens.principal(token.strip())
    if principal is None:
        raise ApiError(401, "the token is not valid")
    request[PRINCIPAL_KEY] = principal.name
    return principal
