"""The static bearer tokens' index (`scheduler.api.auth.Tokens`): a token is found by its
digest, exactly as a scan of every (token, caller) pair would find it, and nothing else is."""

from __future__ import annotations

import dataclasses

import pytest

from ledger.roles import Caller, Role
from scheduler.api.auth import Tokens

ADMIN = "admin-token-0123456789"
VISION = "vision-token-0123456789"
SEARCH = "search-token-0123456789"
VIEWER = "viewer-token-0123456789"
ROTATED = "new-vision-0123456789"
TOKENS = Tokens(
    admin=ADMIN,
    teams={"vision": VISION, "search": SEARCH},
    named={VIEWER: Caller(Role.VIEWER, label="dashboards")},
)


def scanned(tokens: Tokens, token: str) -> Caller | None:
    """What a scan of every pair finds: the last caller whose secret is `token`."""
    found = None
    for secret, caller in tokens.every():
        if secret == token:
            found = caller
    return found


@pytest.mark.parametrize(
    ("token", "expected"),
    [
        pytest.param(ADMIN, Caller(Role.ADMIN), id="the-admin"),
        pytest.param(VISION, Caller(Role.TEAM_LEAD, "vision"), id="a-team"),
        pytest.param(SEARCH, Caller(Role.TEAM_LEAD, "search"), id="another-team"),
        pytest.param(VIEWER, Caller(Role.VIEWER, label="dashboards"), id="a-named-token"),
        pytest.param(VISION[:-1], None, id="a-prefix"),
        pytest.param(VISION + "0", None, id="an-extension"),
        pytest.param(VISION.upper(), None, id="another-case"),
        pytest.param("", None, id="empty"),
        pytest.param("vision-t\udcffoken", None, id="undecodable-bytes"),
        pytest.param("vision-tökén-0123456789", None, id="non-ascii"),
    ],
)
def test_a_token_names_its_caller_and_nothing_else_does(token, expected):
    assert TOKENS.principal(token) == expected == scanned(TOKENS, token)


@pytest.mark.parametrize(
    ("tokens", "token", "expected"),
    [
        pytest.param(
            Tokens(admin="same-0123456789", teams={"vision": "same-0123456789"}),
            "same-0123456789",
            Caller(Role.TEAM_LEAD, "vision"),
            id="admin-and-team-share-a-secret-the-team-listed-later",
        ),
        pytest.param(Tokens(), ADMIN, None, id="no-tokens"),
        pytest.param(Tokens(teams={"vision": VISION}), ADMIN, None, id="no-admin-token"),
    ],
)
def test_the_index_answers_as_a_scan_of_every_pair(tokens, token, expected):
    assert tokens.principal(token) == expected == scanned(tokens, token)


@pytest.mark.parametrize(
    ("change", "gone", "now"),
    [
        pytest.param({"admin": None}, ADMIN, None, id="admin-token-removed"),
        pytest.param({"teams": {"vision": ROTATED}}, VISION, ROTATED, id="team-token-rotated"),
        pytest.param({"named": {}}, VIEWER, None, id="named-token-revoked"),
    ],
)  # fmt: skip
def test_tokens_built_again_know_no_revoked_token(change, gone, now):
    """The index is built with its `Tokens`: tokens made from a changed configuration
    (a restart's) answer for no revoked or rotated secret."""
    changed = dataclasses.replace(TOKENS, **change)
    assert changed.principal(gone) is None
    if now is not None:
        assert changed.principal(now) is not None
    assert changed == Tokens(
        **{**{f: getattr(TOKENS, f) for f in ("admin", "teams", "named")}, **change}
    )
