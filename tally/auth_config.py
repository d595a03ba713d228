"""The `auth:` section of the configuration: single sign-on for people through one OIDC issuer
(`auth.oidc`) — what the API trusts in a bearer JWT, the claim rules that map a person to a
role and team (`ledger.role_claims`), and the dashboard's login client. Static tokens for
machines stay in `scheduler.tokens`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from pydantic import Field, field_validator, model_validator

from ledger.invalid import Invalid
from ledger.role_claims import ClaimRule
from ledger.roles import Role
from tally.config_fields import EnvName, Name, Strict

Algorithm = Literal["RS256", "ES256"]


class ClaimRuleConfig(Strict):
    """A person whose `claim` (a dotted path; default `groups`) equals or contains `value`
    has `role` — in `team`, for `team-lead` and `member`. The first matching rule wins."""

    claim: str = Field("groups", min_length=1, max_length=256)
    value: str = Field(min_length=1, max_length=256)
    role: Role
    team: Name | None = None

    @model_validator(mode="after")
    def _team_for_team_roles(self) -> ClaimRuleConfig:
        self.rule()  # raises ValueError: a team role without a team, or the reverse
        return self

    def rule(self) -> ClaimRule:
        return ClaimRule(self.claim, self.value, self.role, self.team)


class DashboardLoginConfig(Strict):
    """The dashboard's OIDC client (Streamlit's `st.login`): its id, and the environment
    variables holding its secret and the secret that signs the login cookie. `redirect_uri`
    defaults to `http://<dashboard.host>:<dashboard.port>/oauth2callback`."""

    client_id: str = Field(min_length=1, max_length=256)
    client_secret_env: EnvName = "TALLY_OIDC_CLIENT_SECRET"
    cookie_secret_env: EnvName = "TALLY_DASHBOARD_COOKIE_SECRET"
    redirect_uri: str | None = Field(None, pattern=r"^https?://")


class OidcConfig(Strict):
    """One OIDC issuer for people (see the README, "Single sign-on")."""

    issuer: str = Field(pattern=r"^https?://", max_length=1024)
    audience: str = Field(min_length=1, max_length=256)
    discovery_url: str | None = Field(None, pattern=r"^https?://", max_length=1024)
    algorithms: tuple[Algorithm, ...] = Field(("RS256", "ES256"), min_length=1)
    clock_skew_s: int = Field(60, ge=0, le=600)
    jwks_refresh_s: int = Field(3600, ge=60, le=7 * 86_400)
    jwks_refetch_min_s: int = Field(30, ge=1, le=3600)
    user_claim: str = Field("preferred_username", min_length=1, max_length=256)
    roles: tuple[ClaimRuleConfig, ...] = Field(min_length=1)
    dashboard: DashboardLoginConfig | None = None

    @field_validator("algorithms")
    @classmethod
    def _distinct(cls, algorithms: tuple[Algorithm, ...]) -> tuple[Algorithm, ...]:
        if len(set(algorithms)) != len(algorithms):
            raise Invalid("an algorithm appears twice")
        return algorithms

    def rules(self) -> tuple[ClaimRule, ...]:
        return tuple(r.rule() for r in self.roles)

    def discovery(self) -> str:
        return self.discovery_url or self.issuer.rstrip("/") + "/.well-known/openid-configuration"


class AuthConfig(Strict):
    """How people sign in; without `oidc`, only the static tokens are accepted."""

    oidc: OidcConfig | None = None


def check_auth_teams(auth: AuthConfig, teams: Mapping[str, object]) -> None:
    """Raise ValueError if a claim rule names a team the organisation does not have."""
    if auth.oidc is None:
        return
    unknown = sorted({r.team for r in auth.oidc.roles if r.team and r.team not in teams})
    if unknown:
        raise Invalid("auth.oidc.roles: unknown team(s) {teams}", teams=", ".join(unknown))
