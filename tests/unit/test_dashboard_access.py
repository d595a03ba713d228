"""Single sign-on in the dashboard: the pages each role sees (from the permission table), the
login screen that shows nothing of the ledger, a signed-in person's pages and team from
`st.user`'s claims through the API's claim rules (Streamlit AppTest on the seeded ledger), and
the secrets file and environment `tally` hands Streamlit's `st.login`."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

from dashboard.access import LOGIN_ENV, visible_pages
from ledger.role_claims import ClaimMapping, ClaimRule
from ledger.roles import Role
from tally.config import ConfigError, parse_config
from tally.dashboard_login import secrets_path, secrets_toml, write_secrets
from tally.stack import dashboard_command, ledger_env
from tests.builders import a_config_dict
from tests.conftest import REPO
from tests.unit.test_dashboard_seed import seed_ledger

APP = str(REPO / "dashboard" / "app.py")
ALL_PAGES = {"finance", "platform", "team", "capacity", "whatif", "audit", "requests"}


@pytest.mark.parametrize(
    ("role", "pages"),
    [
        pytest.param(role, pages, id=role.value)
        for role, pages in (
            (Role.ADMIN, ALL_PAGES),
            (Role.FINANCE, ALL_PAGES),
            (Role.VIEWER, ALL_PAGES),
            (Role.OPERATOR, {"platform", "capacity", "requests"}),
            (Role.TEAM_LEAD, {"team", "jobs", "requests"}),
            (Role.MEMBER, {"team", "jobs", "requests"}),
        )
    ],
)
def test_each_role_sees_the_pages_the_permission_table_allows(role, pages):
    assert visible_pages(role) == pages


MAPPING = ClaimMapping(
    (
        ClaimRule("groups", "finance", Role.FINANCE),
        ClaimRule("groups", "vision", Role.MEMBER, "vision"),
        ClaimRule("groups", "ops", Role.OPERATOR),
    ),
    "preferred_username",
)


def test_the_claim_mapping_travels_as_json():
    assert ClaimMapping.from_json(MAPPING.to_json()) == MAPPING
    with pytest.raises(ValueError, match="not a claim mapping"):
        ClaimMapping.from_json('{"rules": [{"claim": "groups"}], "user_claim": "x"}')


# ---------------------------------------------------------------------------- the app


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return seed_ledger(tmp_path_factory.mktemp("access") / "ledger")


def _app(monkeypatch, seeded: Path, user: dict[str, Any], page: str | None = None) -> AppTest:
    monkeypatch.setenv("TALLY_DATA_DIR", str(seeded))
    monkeypatch.setenv("TALLY_CURRENCY", "USD")
    monkeypatch.setenv(LOGIN_ENV, MAPPING.to_json())
    app = AppTest.from_file(APP, default_timeout=60)
    app.user = user
    app.run()
    if page is not None:
        app.switch_page(page).run()
    assert not app.exception, [e.value for e in app.exception]
    return app


def _shows_no_data(app: AppTest) -> None:
    assert not app.dataframe and not app.metric  # the login screen has only the language switch
    assert [s.key for s in app.selectbox] == ["language"]


def test_before_signing_in_only_the_login_screen_is_shown(monkeypatch, seeded):
    app = _app(monkeypatch, seeded, {"is_logged_in": False})
    assert [b.label for b in app.button] == ["Log in"]
    _shows_no_data(app)


def test_a_signed_in_person_without_a_role_sees_nothing(monkeypatch, seeded):
    app = _app(monkeypatch, seeded, {"is_logged_in": True, "preferred_username": "eve"})
    assert "has no role in Tally" in app.error[0].value
    assert [b.label for b in app.button] == ["Log out"]
    _shows_no_data(app)


def test_a_member_sees_only_their_teams_page(monkeypatch, seeded):
    user = {"is_logged_in": True, "preferred_username": "ada", "groups": ["vision"]}
    app = _app(monkeypatch, seeded, user)
    assert app.title[0].value == "Team: jobs, budget and quota"  # the default: their one page
    assert app.selectbox(key="team").options == ["vision"]
    assert "Team **vision**" in " ".join(m.value for m in app.markdown)
    assert any("Signed in as **ada** · member of vision" in c.value for c in app.caption)
    with pytest.raises(
        ValueError,
        match=r"Known pages: \['.*/page_team.py', '.*/page_portal.py', '.*/page_requests.py'\]",
    ):
        app.switch_page("page_finance.py")  # not registered for a member: no URL reaches it


def test_finance_sees_every_page_and_every_team(monkeypatch, seeded):
    user = {"is_logged_in": True, "preferred_username": "bo", "groups": ["finance"]}
    app = _app(monkeypatch, seeded, user)
    assert app.title[0].value.startswith("Finance")
    assert app.selectbox(key="team").options == ["All teams", "search", "vision"]


def test_without_single_sign_on_everyone_sees_everything_as_before(monkeypatch, seeded):
    monkeypatch.delenv(LOGIN_ENV, raising=False)
    monkeypatch.setenv("TALLY_DATA_DIR", str(seeded))
    app = AppTest.from_file(APP, default_timeout=60).run()
    assert app.title[0].value.startswith("Finance") and not app.button


# ---------------------------------------------------------------------------- tally's side

OIDC = {
    "issuer": "http://127.0.0.1:9000/realms/acme",
    "audience": "tally",
    "roles": [{"value": "vision", "role": "member", "team": "vision"}],
    "dashboard": {"client_id": "tally-dashboard"},
}
SECRETS = {"TALLY_OIDC_CLIENT_SECRET": 'client "secret"', "TALLY_DASHBOARD_COOKIE_SECRET": "c00kie"}


def test_tally_writes_streamlits_auth_secrets_from_the_config_and_environment(tmp_path):
    data = a_config_dict(auth={"oidc": OIDC}, ledger={"data_dir": str(tmp_path / "data")})
    config = parse_config(data)
    assert secrets_toml(config, SECRETS) == (
        "# written by tally from auth.oidc.dashboard: do not edit\n"
        "[auth]\n"
        'redirect_uri = "http://127.0.0.1:8501/oauth2callback"\n'
        'cookie_secret = "c00kie"\n'
        'client_id = "tally-dashboard"\n'
        'client_secret = "client \\"secret\\""\n'
        'server_metadata_url = "http://127.0.0.1:9000/realms/acme/.well-known/openid-configuration"\n'
        'expose_tokens = ["access"]\n'
    )
    path = write_secrets(config, SECRETS)
    assert path == secrets_path(config) == tmp_path / "dashboard" / "secrets.toml"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text() == secrets_toml(config, SECRETS)
    command = dashboard_command(config)
    assert command[command.index("--secrets.files") + 1] == str(path)
    assert command[command.index("--client.toolbarMode") + 1] == "viewer"  # no "Deploy"
    mapping = ClaimMapping.from_json(ledger_env(config, tmp_path / "t.yaml")[LOGIN_ENV])
    assert mapping.rules == (ClaimRule("groups", "vision", Role.MEMBER, "vision"),)


def test_a_missing_dashboard_secret_is_a_config_error_and_no_login_writes_nothing(tmp_path):
    config = parse_config(a_config_dict(auth={"oidc": OIDC}))
    with pytest.raises(ConfigError, match="TALLY_DASHBOARD_COOKIE_SECRET is not set"):
        secrets_toml(config, {"TALLY_OIDC_CLIENT_SECRET": "x"})
    plain = parse_config(a_config_dict(ledger={"data_dir": str(tmp_path / "data")}))
    assert write_secrets(plain, {}) is None and not (tmp_path / "dashboard").exists()
    assert "--secrets.files" not in dashboard_command(plain)
    assert LOGIN_ENV not in ledger_env(plain, tmp_path / "t.yaml")


def test_the_login_screen_speaks_the_configured_language(monkeypatch, seeded):
    monkeypatch.setenv("TALLY_DASHBOARD_LANGUAGE", "zh-CN")
    app = _app(monkeypatch, seeded, {"is_logged_in": False})
    assert [b.label for b in app.button] == ["登录"]
    assert "请使用组织账号登录" in app.markdown[0].value
    _shows_no_data(app)
