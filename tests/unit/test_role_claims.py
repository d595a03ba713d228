"""The claim rules that map a signed-in person to a role and team (`ledger.role_claims`), and
the `auth.oidc` configuration section they are read from."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from ledger.role_claims import ClaimRule, caller_from_claims, claim_values
from ledger.roles import Caller, Role
from tally.config import ConfigError, parse_config
from tests.builders import a_config_dict
from tests.conftest import REPO

RULES = (
    ClaimRule("groups", "platform-admins", Role.ADMIN),
    ClaimRule("groups", "vision-leads", Role.TEAM_LEAD, "vision"),
    ClaimRule("groups", "vision", Role.MEMBER, "vision"),
    ClaimRule("department", "finance", Role.FINANCE),
    ClaimRule("resource_access.tally.roles", "viewer", Role.VIEWER),
)


def ada(role: Role, team: str | None = None) -> Caller:
    return Caller(role, team, "ada", "oidc:ada")


@pytest.mark.parametrize(
    ("claims", "expected"),
    [
        ({"groups": ["vision"]}, ada(Role.MEMBER, "vision")),
        ({"groups": ["vision", "vision-leads"]}, ada(Role.TEAM_LEAD, "vision")),
        ({"groups": ["vision", "platform-admins"]}, ada(Role.ADMIN)),
        ({"department": "finance"}, ada(Role.FINANCE)),
        ({"department": ["finance"]}, ada(Role.FINANCE)),
        (
            {"resource_access": {"tally": {"roles": ["viewer"]}}},
            ada(Role.VIEWER),
        ),
        ({"groups": ["Vision"]}, None),  # values are compared exactly
        ({"groups": [["vision"]]}, None),  # only strings count
        ({"groups": {"vision": True}}, None),
        ({"resource_access": ["tally"]}, None),
        ({}, None),
    ],
    ids=[
        "member", "lead-before-member", "first-rule-wins", "string-claim", "list-claim",
        "nested-path", "case-matters", "nested-list", "object-claim", "path-through-list",
        "no-claims",
    ],
)  # fmt: skip
def test_the_first_matching_rule_decides_the_role(claims: dict[str, Any], expected):
    assert (
        caller_from_claims({"preferred_username": "ada", **claims}, RULES, "preferred_username")
        == expected
    )


@pytest.mark.parametrize(
    "user", [None, "", ["ada", "grace"], 7], ids=["missing", "empty", "two-users", "number"]
)
def test_a_token_naming_no_single_user_maps_to_no_caller(user):
    claims = {"groups": ["platform-admins"], **({} if user is None else {"email": user})}
    assert caller_from_claims(claims, RULES, "email") is None


def test_claim_values_reads_strings_and_lists_of_strings_only():
    assert claim_values({"a": {"b": ["x", 1, "y"]}}, "a.b") == ("x", "y")
    assert claim_values({"a": "x"}, "a.b") == ()


@pytest.mark.parametrize(
    ("role", "team"),
    [(Role.MEMBER, None), (Role.FINANCE, "vision")],
    ids=["team-role-without-team", "org-role-with-team"],
)
def test_a_rule_must_match_its_roles_scope(role, team):
    with pytest.raises(ValueError, match="claim rule groups=g"):
        ClaimRule("groups", "g", role, team)


OIDC = {
    "issuer": "https://login.example.com/realms/acme",
    "audience": "tally",
    "roles": [
        {"value": "gpu-finance", "role": "finance"},
        {
            "claim": "realm_access.roles",
            "value": "vision-lead",
            "role": "team-lead",
            "team": "vision",
        },
    ],
}


def test_the_oidc_section_is_read_with_its_defaults():
    oidc = parse_config(a_config_dict(auth={"oidc": OIDC})).auth.oidc
    assert oidc is not None
    assert (
        oidc.discovery() == "https://login.example.com/realms/acme/.well-known/openid-configuration"
    )
    assert (oidc.algorithms, oidc.clock_skew_s, oidc.user_claim) == (
        ("RS256", "ES256"),
        60,
        "preferred_username",
    )
    assert oidc.rules() == (
        ClaimRule("groups", "gpu-finance", Role.FINANCE),
        ClaimRule("realm_access.roles", "vision-lead", Role.TEAM_LEAD, "vision"),
    )
    assert parse_config(a_config_dict()).auth.oidc is None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"algorithms": ["HS256"]}, "algorithms[0]: Input should be 'RS256' or 'ES256'"),
        ({"algorithms": ["none"]}, "algorithms[0]: Input should be 'RS256' or 'ES256'"),
        ({"issuer": "login.example.com"}, "issuer"),
        ({"roles": []}, "roles"),
        ({"roles": [{"value": "g", "role": "member"}]}, "role member needs a team"),
        ({"roles": [{"value": "g", "role": "admin", "team": "vision"}]}, "organisation-wide"),
        ({"roles": [{"value": "g", "role": "member", "team": "nope"}]}, "unknown team(s) nope"),
        ({"clock_skew_s": 3600}, "clock_skew_s"),
        ({"dashboard": {"client_id": "c", "client_secret_env": "lower case"}}, "client_secret_env"),
    ],
    ids=[
        "hs256", "alg-none", "issuer-not-url", "no-rules", "member-without-team",
        "admin-with-team", "unknown-team", "skew-too-large", "bad-env-name",
    ],
)  # fmt: skip
def test_a_bad_oidc_section_is_refused(change, message):
    with pytest.raises(ConfigError) as caught:
        parse_config(a_config_dict(auth={"oidc": {**OIDC, **change}}))
    assert message in str(caught.value)


def test_the_examples_commented_auth_section_is_valid():
    text = (REPO / "deploy/examples/tally.yaml").read_text().split("\n# auth:\n", 1)[1]
    block = "auth:\n" + "\n".join(line.removeprefix("# ") for line in text.splitlines())
    oidc = parse_config(a_config_dict(**yaml.safe_load(block))).auth.oidc
    assert oidc is not None and [r.role for r in oidc.rules()] == [
        Role.ADMIN,
        Role.FINANCE,
        Role.TEAM_LEAD,
        Role.MEMBER,
    ]
