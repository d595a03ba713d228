"""Who a person signed in through OIDC is: the claim rules (`ClaimRule`) that map a token's
claims or groups to a role and team, and `caller_from_claims`, the one mapping the API (bearer
JWTs) and the dashboard (`st.user`) both use. Pure: claims in, a `ledger.roles.Caller` or None
(no rule matched: the person is known but may do nothing) out. `ClaimMapping` carries the rules
and the user claim to the dashboard process as JSON.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ledger.invalid import Invalid
from ledger.roles import Caller, Role

OIDC_LABEL = "oidc:"  # a signed-in person's caller label: `oidc:<user>`


@dataclass(frozen=True, slots=True)
class ClaimRule:
    """A person whose `claim` equals `value` (or, for a list claim such as `groups`, contains
    it) has `role` (in `team`, for a team role). `claim` may be a dotted path into nested
    objects (`realm_access.roles`)."""

    claim: str
    value: str
    role: Role
    team: str | None = None

    def __post_init__(self) -> None:
        if self.role.per_team != (self.team is not None):
            if self.role.per_team:
                raise Invalid(
                    "claim rule {claim}={value}: role {role} needs a team",
                    claim=self.claim,
                    value=self.value,
                    role=str(self.role),
                )
            raise Invalid(
                "claim rule {claim}={value}: role {role} is organisation-wide: no team",
                claim=self.claim,
                value=self.value,
                role=str(self.role),
            )


def claim_values(claims: Mapping[str, object], claim: str) -> tuple[str, ...]:
    """The string values of `claim` (a dotted path) in `claims`: one for a string, each string
    of a list, none for anything else or a missing claim."""
    found: object = claims
    for part in claim.split("."):
        if not isinstance(found, Mapping) or part not in found:
            return ()
        found = found[part]
    if isinstance(found, str):
        return (found,)
    if isinstance(found, list):
        return tuple(v for v in found if isinstance(v, str))
    return ()


def caller_from_claims(
    claims: Mapping[str, object], rules: Sequence[ClaimRule], user_claim: str
) -> Caller | None:
    """The caller `claims` name: the first rule (in order) that matches decides the role and
    team; the user is the `user_claim` claim. None: no rule matches, or the token names no
    user."""
    users = claim_values(claims, user_claim)
    if len(users) != 1 or not users[0]:
        return None
    user = users[0]
    for rule in rules:
        if rule.value in claim_values(claims, rule.claim):
            return Caller(rule.role, rule.team, user, label=f"{OIDC_LABEL}{user}")
    return None


@dataclass(frozen=True, slots=True)
class ClaimMapping:
    """The rules and the user claim together: what the dashboard is handed (as JSON, in its
    environment) to map `st.user`'s claims the way the API maps a token's."""

    rules: tuple[ClaimRule, ...]
    user_claim: str

    def caller(self, claims: Mapping[str, object]) -> Caller | None:
        return caller_from_claims(claims, self.rules, self.user_claim)

    def to_json(self) -> str:
        rules = [
            {"claim": r.claim, "value": r.value, "role": str(r.role), "team": r.team}
            for r in self.rules
        ]
        return json.dumps({"user_claim": self.user_claim, "rules": rules})

    @classmethod
    def from_json(cls, text: str) -> ClaimMapping:
        """The mapping `to_json` wrote; raises ValueError for anything else."""
        try:
            data = json.loads(text)
            rules = tuple(
                ClaimRule(str(r["claim"]), str(r["value"]), Role(r["role"]), r["team"])
                for r in data["rules"]
            )
            return cls(rules, str(data["user_claim"]))
        except (TypeError, KeyError) as exc:
            raise ValueError(f"not a claim mapping: {exc}") from None
