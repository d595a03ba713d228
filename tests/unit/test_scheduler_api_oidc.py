"""People's bearer JWTs at the scheduler API, checked against a real OIDC issuer on loopback
(`tests.oidc_issuer`: discovery, JWKS, signed tokens): the role and team come from the claims;
expired, wrong-audience, wrong-issuer, unsigned, HS256-confused, tampered and unknown-key tokens
are refused (401); a person with no role is 403; rotated keys are refetched once, rate-limited;
static tokens keep working beside them."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
from click.testing import CliRunner

from ledger.role_claims import ClaimRule
from ledger.roles import Role
from scheduler.api.oidc import OidcSettings, OidcVerifier
from scheduler.executors.fake import RUNS_FOREVER
from tally.cli import cli
from tests.builders import a_config_dict
from tests.conftest import write_config
from tests.oidc_issuer import AUDIENCE, CLIENT_ID, CLIENT_SECRET, Issuer, ec_key, renamed, rsa_key
from tests.unit.test_scheduler_api_support import ADMIN, Api, a_job
from tests.unit.test_scheduler_service_support import Rig

RULES = (
    ClaimRule("groups", "gpu-admins", Role.ADMIN),
    ClaimRule("groups", "finance", Role.FINANCE),
    ClaimRule("groups", "vision-leads", Role.TEAM_LEAD, "vision"),
    ClaimRule("groups", "vision-members", Role.MEMBER, "vision"),
    ClaimRule("realm_access.roles", "language-member", Role.MEMBER, "language"),
)
SKEW_S = 60
REFETCH_MIN_S = 30.0


class Clock:
    """Wall-clock seconds the test moves (the verifier's notion of now for keys)."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def issuer() -> Iterator[Issuer]:
    with Issuer().serving() as served:
        yield served


@pytest.fixture
def rig(tmp_path) -> Rig:
    rig = Rig(tmp_path)
    rig.executor.default = RUNS_FOREVER
    return rig


def a_verifier(issuer: Issuer, clock: Clock | None = None, **overrides: Any) -> OidcVerifier:
    settings = OidcSettings(
        issuer=overrides.pop("issuer_url", issuer.url),
        audience=AUDIENCE,
        rules=RULES,
        clock_skew_s=SKEW_S,
        jwks_refetch_min_s=REFETCH_MIN_S,
        **overrides,
    )
    return OidcVerifier(settings, clock or Clock(time.time()))


@pytest.fixture
def api(rig: Rig, issuer: Issuer) -> Iterator[Api]:
    issuer.keys = [rsa_key("rsa-1"), ec_key("ec-1")]
    issuer.person = {"preferred_username": "ada", "groups": ["vision-members"]}
    instance = Api(rig, oidc=a_verifier(issuer))
    try:
        yield instance
    finally:
        instance.close()


def balance_teams(api: Api, token: str) -> tuple[int, Any]:
    status, body = api.call("GET", "/v1/balances", token)
    return status, sorted(b["team"] for b in body["balances"]) if status == 200 else body


@pytest.mark.parametrize(
    ("claims", "teams"),
    [
        ({"groups": ["staff", "finance"]}, ["language", "vision"]),
        ({"groups": ["gpu-admins", "vision-members"]}, ["language", "vision"]),  # first rule wins
        ({"groups": ["vision-leads"]}, ["vision"]),
        ({"groups": "vision-members"}, ["vision"]),  # a single string claim
        ({"groups": [], "realm_access": {"roles": ["language-member"]}}, ["language"]),
    ],
    ids=["finance-all-teams", "admin-first-rule", "team-lead", "member-string", "nested-claim"],
)
def test_a_valid_token_gets_the_role_and_team_its_claims_map_to(api, issuer, claims, teams):
    assert balance_teams(api, issuer.token(**claims)) == (200, teams)


def test_a_member_signed_in_acts_as_their_user_within_their_team(api, issuer):
    ada = issuer.token(preferred_username="ada", groups=["vision-members"])
    status, body = api.call("POST", "/v1/jobs", ada, json=a_job(user="ada"))
    assert status == 201 and body["job"]["team"] == "vision", body
    status, body = api.call("POST", "/v1/jobs", ada, json=a_job(user="grace"))
    assert status == 403, body
    status, body = api.call("POST", "/v1/jobs", ada, json=a_job(team="language", user="ada"))
    assert status == 404, body


def test_an_es256_token_is_accepted_and_static_tokens_still_work(api, issuer):
    token = issuer.sign(issuer.claims(groups=["finance"]), issuer.keys[1])  # the EC key
    assert balance_teams(api, token)[0] == 200
    assert balance_teams(api, ADMIN) == (200, ["language", "vision"])


REFUSED = [
    ("expired", lambda i: i.token(exp=int(i.claims()["iat"]) - SKEW_S - 1), "expired"),
    ("wrong-audience", lambda i: i.token(aud="another-service"), "'aud'"),
    ("wrong-issuer", lambda i: i.token(iss="http://127.0.0.1:1/evil"), "'iss'"),
    ("no-expiry", lambda i: i.token(exp=None), "'exp'"),
    ("not-yet-valid", lambda i: i.token(nbf=int(i.claims()["iat"]) + SKEW_S + 30), "'nbf'"),
    ("issued-in-future", lambda i: i.token(iat=int(i.claims()["iat"]) + SKEW_S + 30), "'iat'"),
    ("alg-none", lambda i: i.forge_unsigned(groups=["gpu-admins"]), "'none' is not accepted"),
    ("hs256-with-public-key", lambda i: i.forge_hs256(groups=["gpu-admins"]), "'HS256'"),
    ("unknown-key", lambda i: i.sign(i.claims(), rsa_key("stranger")), "not among"),
    ("other-key-same-kid", lambda i: i.sign(i.claims(), renamed(rsa_key("x"), "rsa-1")), "signa"),
    ("tampered", lambda i: tampered(i.token()), "signature"),
    ("garbage-jwt", lambda i: "not.a.jwt", "not a readable JWT"),
]


def tampered(token: str) -> str:
    """`token` with its payload changed to claim a more privileged group."""
    head, payload, signature = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    claims["groups"] = ["gpu-admins"]
    forged = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    return f"{head}.{forged}.{signature}"


@pytest.mark.parametrize(("make", "why"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_a_token_that_is_not_valid_is_refused(api, issuer, make, why):
    status, body = api.call("GET", "/v1/balances", make(issuer))
    assert status == 401, body
    assert why in body["error"]["message"]
    assert api.headers["WWW-Authenticate"].startswith("Bearer")


def test_a_token_expired_within_the_clock_skew_is_still_accepted(api, issuer):
    now = int(issuer.claims()["iat"])
    assert balance_teams(api, issuer.token(exp=now - SKEW_S + 5))[0] == 200


def test_a_person_no_rule_maps_to_a_role_is_forbidden(api, issuer):
    for claims in ({"groups": ["staff"]}, {"groups": ["finance"], "preferred_username": None}):
        status, body = api.call("GET", "/v1/balances", issuer.token(**claims))
        assert (status, body["error"]["code"]) == (403, "forbidden"), claims


def test_rotated_keys_are_refetched_once_and_the_old_key_is_refused(rig, issuer):
    clock = Clock(time.time())
    issuer.keys = [rsa_key("rsa-1")]
    api = Api(rig, oidc=a_verifier(issuer, clock))
    try:
        before = issuer.jwks_requests
        old = issuer.token(groups=["finance"])
        assert balance_teams(api, old)[0] == 200
        assert issuer.jwks_requests == before + 1  # fetched on first use, then cached
        assert balance_teams(api, old)[0] == 200
        assert issuer.jwks_requests == before + 1

        clock.now += REFETCH_MIN_S  # the next unknown kid may refetch
        old_key = issuer.rotate("rsa-2")
        new = issuer.token(groups=["finance"])
        assert balance_teams(api, new)[0] == 200  # unknown kid → one refetch → accepted
        assert issuer.jwks_requests == before + 2
        status, body = api.call("GET", "/v1/balances", old)  # its key is gone from the JWKS
        assert status == 401 and "not among" in body["error"]["message"]
        forged = issuer.sign(issuer.claims(), rsa_key("stranger"))
        assert api.call("GET", "/v1/balances", forged)[0] == 401
        assert issuer.jwks_requests == before + 2  # unknown kids within the limit: no refetch

        clock.now += REFETCH_MIN_S
        issuer.keys.append(old_key)  # the issuer publishes the old key again
        assert balance_teams(api, old)[0] == 200
        assert issuer.jwks_requests == before + 3
    finally:
        api.close()


def test_without_the_issuers_keys_the_answer_is_503_and_static_tokens_still_work(rig, issuer):
    dead = a_verifier(issuer, discovery_url="http://127.0.0.1:9/.well-known/openid-configuration")
    api = Api(rig, oidc=dead)
    try:
        status, body = api.call("GET", "/v1/balances", issuer.token())
        assert (status, body["error"]["code"]) == (503, "unavailable"), body
        assert balance_teams(api, ADMIN)[0] == 200
    finally:
        api.close()


def test_a_discovery_document_for_another_issuer_is_not_trusted(rig, issuer):
    discovery = f"{issuer.url}/.well-known/openid-configuration"  # names issuer.url
    api = Api(
        rig, oidc=a_verifier(issuer, issuer_url=issuer.url + "/other", discovery_url=discovery)
    )
    try:
        token = issuer.token(iss=issuer.url + "/other")
        assert api.call("GET", "/v1/balances", token)[0] == 503
    finally:
        api.close()


# ---------------------------------------------------------------------------- the CLI's --token

ADJUST = ("ledger", "adjust", "--account", "consumer:vision/detection", "--amount", "5",
          "--unit", "money", "--period", "2026-11", "--reason", "fix")  # fmt: skip


@pytest.mark.parametrize(
    ("claims", "code", "text"),
    [
        ({"groups": ["vision-members"]}, 2, "refused for member:oidc:ada: role member may not"),
        ({"groups": ["finance"], "exp": 1}, 2, "the OIDC token is refused: the token has expired"),
        ({"groups": ["staff"]}, 2, "the OIDC token is refused: the token's claims give it no role"),
        ({"groups": ["finance"]}, 4, "no ledger"),  # allowed: on to the next check
    ],
    ids=["member-refused", "expired", "no-role", "finance-allowed"],
)
def test_the_cli_checks_a_persons_jwt_before_sending_an_admin_event(
    issuer, tmp_path, claims, code, text
):
    issuer.keys = [rsa_key("rsa-1")]
    roles = [
        {"value": "finance", "role": "finance"},
        {"value": "vision-members", "role": "member", "team": "vision"},
    ]
    oidc = {"issuer": issuer.url, "audience": AUDIENCE, "roles": roles}
    path = write_config(tmp_path / "tally.yaml", a_config_dict(auth={"oidc": oidc}))
    args = [*ADJUST, "--config", str(path), "--data-dir", str(tmp_path / "none")]
    result = CliRunner().invoke(cli, args, env={"TALLY_TOKEN": issuer.token(**claims)})
    assert result.exit_code == code, result.output
    assert text in result.output


# ---------------------------------------------------------------------------- the issuer's login


def test_the_issuers_code_flow_gives_an_id_token_the_verifier_accepts(issuer):
    """What the dashboard's login goes through: authorize → code → token (ID token with the
    nonce, for the client), each code used once, the client's secret required."""
    issuer.keys = [rsa_key("rsa-1")]
    issuer.person = {"preferred_username": "ada", "groups": ["vision-members"]}
    back = "http://127.0.0.1:8501/oauth2callback"
    query = {"response_type": "code", "client_id": CLIENT_ID, "redirect_uri": back,
             "state": "s-1", "nonce": "n-1", "scope": "openid"}  # fmt: skip
    answer = requests.get(f"{issuer.url}/authorize", params=query, allow_redirects=False, timeout=5)
    assert answer.status_code == 302
    location = urlsplit(answer.headers["Location"])
    got = parse_qs(location.query)
    assert f"{location.scheme}://{location.netloc}{location.path}" == back
    assert got["state"] == ["s-1"]
    form = {"grant_type": "authorization_code", "code": got["code"][0], "redirect_uri": back}
    wrong = requests.post(f"{issuer.url}/token", data=form, auth=(CLIENT_ID, "nope"), timeout=5)
    assert (wrong.status_code, wrong.json()) == (400, {"error": "invalid_client"})
    tokens = requests.post(
        f"{issuer.url}/token", data=form, auth=(CLIENT_ID, CLIENT_SECRET), timeout=5
    )
    assert tokens.status_code == 200
    again = requests.post(
        f"{issuer.url}/token", data=form, auth=(CLIENT_ID, CLIENT_SECRET), timeout=5
    )
    assert (again.status_code, again.json()) == (400, {"error": "invalid_grant"})

    settings = OidcSettings(issuer=issuer.url, audience=CLIENT_ID, rules=RULES)
    id_token = tokens.json()["id_token"]
    caller = asyncio.run(OidcVerifier(settings).caller(id_token))
    assert (caller.role, caller.team, caller.user) == (Role.MEMBER, "vision", "ada")
    payload = id_token.split(".")[1]
    assert (
        json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))["nonce"] == "n-1"
    )
