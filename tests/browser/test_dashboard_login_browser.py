"""Single sign-on through the dashboard in headless Chromium: `tally dashboard` with
`auth.oidc.dashboard` against the loopback issuer (`tests/oidc_issuer.py`, real HTTP, signed
ID tokens). The browser is redirected to the issuer's authorization endpoint, comes back to
Streamlit's `/oauth2callback` with a code, and Streamlit's `st.login` (Authlib's Starlette
client over httpx) trades it at the token endpoint. A team member then sees only their team's
page; a finance user sees Finance. The toolbar has no "Deploy" button."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import free_port, launch_chromium, serving_dashboard
from tests.builders import a_config_dict
from tests.conftest import tally_command, write_config
from tests.oidc_issuer import AUDIENCE, CLIENT_ID, CLIENT_SECRET, Issuer

pytestmark = pytest.mark.browser

TIMEOUT_MS = 60_000
MEMBER = {"preferred_username": "ada", "groups": ["vision-members"]}
FINANCE = {"preferred_username": "bo", "groups": ["finance"]}


@pytest.fixture(scope="module")
def issuer() -> Iterator[Issuer]:
    with Issuer().serving() as served:
        yield served


@pytest.fixture(scope="module")
def login_dashboard(
    issuer: Issuer, seeded_ledger: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """`tally dashboard` over the seeded ledger with a dashboard login at `issuer`."""
    port = free_port()
    home = tmp_path_factory.mktemp("login")
    oidc = {
        "issuer": issuer.url,
        "audience": AUDIENCE,
        "roles": [
            {"value": "finance", "role": "finance"},
            {"value": "vision-members", "role": "member", "team": "vision"},
        ],
        "dashboard": {"client_id": CLIENT_ID},
    }
    config = a_config_dict(
        auth={"oidc": oidc},
        dashboard={"host": "127.0.0.1", "port": port},
        ledger={"data_dir": str(seeded_ledger), "currency": "USD"},
    )
    path = write_config(home / "tally.yaml", config)
    env = {
        "TALLY_OIDC_CLIENT_SECRET": CLIENT_SECRET,
        "TALLY_DASHBOARD_COOKIE_SECRET": "a-cookie-secret-for-the-browser-test",
    }
    command = tally_command("dashboard", "--config", str(path), "--log-level", "warning")
    with serving_dashboard(home, env, port, command) as url:
        yield url


@pytest.fixture(scope="module")
def browser(login_dashboard: str) -> Iterator[Any]:
    with launch_chromium() as chromium:
        yield chromium


def _sign_in(browser: Any, url: str, issuer: Issuer, person: dict[str, Any]) -> Any:
    """A fresh browser (no cookies) signs `person` in; the page back on the dashboard."""
    issuer.person = person
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    seen: list[str] = []
    page.on("request", lambda r: seen.append(r.url) if r.is_navigation_request() else None)
    page.goto(url)
    page.get_by_role("button", name="Log in").click()
    page.get_by_text(f"Signed in as {person['preferred_username']}").wait_for()
    assert any(u.startswith(f"{issuer.url}/authorize?") for u in seen), seen
    assert any(u.startswith(f"{url}/oauth2callback?code=") for u in seen), seen
    return page


def _pages(page: Any) -> list[str]:
    nav = page.locator('[data-testid="stSidebarNav"] a')
    return [nav.nth(i).inner_text().splitlines()[-1] for i in range(nav.count())]


def test_a_member_signs_in_at_the_issuer_and_sees_only_their_team(browser, login_dashboard, issuer):
    page = _sign_in(browser, login_dashboard, issuer, MEMBER)
    try:
        page.get_by_role("heading", name="Team: jobs, budget and quota").wait_for()
        page.get_by_text("Team vision").first.wait_for()
        assert page.get_by_text("member of vision").count() == 1
        assert _pages(page) == []  # one page: Streamlit shows no navigation
        assert page.get_by_role("button", name="Deploy").count() == 0
        assert page.locator('[data-testid="stException"]').count() == 0
    finally:
        page.context.close()


def test_a_finance_user_signs_in_and_sees_finance(browser, login_dashboard, issuer):
    page = _sign_in(browser, login_dashboard, issuer, FINANCE)
    try:
        page.get_by_role("heading", name="Finance: GPU cost").wait_for()
        assert _pages(page) == ["Finance", "Platform", "Team", "Capacity planning", "Audit"]
        assert page.get_by_role("button", name="Deploy").count() == 0
        assert page.locator('[data-testid="stException"]').count() == 0
    finally:
        page.context.close()
