"""Single sign-on through the dashboard in headless Chromium: `tally dashboard` with
`auth.oidc.dashboard` against the loopback issuer (`tests/oidc_issuer.py`, real HTTP, signed
ID tokens). The browser is redirected to the issuer's authorization endpoint, comes back to
Streamlit's `/oauth2callback` with a code, and Streamlit's `st.login` (Authlib's Starlette
client over httpx) trades it at the token endpoint. A team member then sees only their team's
page, the portal and the Requests page; a finance user sees Finance. The toolbar has no
"Deploy" button.

The portal ("My jobs") and the Requests page call the scheduler's real API — an aiohttp server
on loopback over the scheduler service on the fake executor
(`tests.unit.test_scheduler_service_support.Rig`, ticked in the server's loop), verifying the
forwarded access token against the same issuer: a member submits from a saved template, sees
the job running, and cancels it, then saves the form as a template of their own, submits from
it and deletes it; a team lead files a budget request, finance (a second browser) approves it
with a comment, and the lead sees it approved among the team's requests."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dashboard.template_store import Person, TemplateStore
from tests.api_server import ApiServer
from tests.browser.conftest import free_port, launch_chromium, serving_dashboard
from tests.builders import a_config_dict
from tests.conftest import tally_command, write_config
from tests.oidc_issuer import AUDIENCE, CLIENT_ID, CLIENT_SECRET, Issuer
from tests.unit.test_scheduler_api_oidc import Clock, a_verifier

pytestmark = pytest.mark.browser

TIMEOUT_MS = 60_000
MEMBER = {"preferred_username": "ada", "groups": ["vision-members"]}
ADA = Person("user-1", "ada")  # the issuer's `sub` for everyone it signs in, and her name
FINANCE = {"preferred_username": "bo", "groups": ["finance"]}
LEAD = {"preferred_username": "lee", "groups": ["vision-leads"]}


@pytest.fixture(scope="module")
def issuer() -> Iterator[Issuer]:
    with Issuer().serving() as served:
        yield served


TEMPLATE = {
    "name": "detection smoke test",
    "queue": "dev",
    "project": "detection",
    "gpus": 1,
    "estimated_runtime_hours": 0.5,
    "command": ["sleep", "600"],
}


class WallClock(Clock):
    """The verifier's clock follows the wall clock: the module's tests sign in minutes apart,
    longer than the clock skew a frozen clock would allow a new token's `iat`."""

    def __call__(self) -> float:
        return time.time()


@pytest.fixture(scope="module")
def api(issuer: Issuer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    verifier = a_verifier(issuer, WallClock(0))
    with ApiServer(tmp_path_factory.mktemp("api"), verifier) as server:
        yield server


@pytest.fixture(scope="module")
def login_dashboard(
    issuer: Issuer, api: ApiServer, seeded_ledger: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """`tally dashboard` over the seeded ledger with a dashboard login at `issuer` and the
    portal calling `api`."""
    port = free_port()
    home = tmp_path_factory.mktemp("login")
    oidc = {
        "issuer": issuer.url,
        "audience": AUDIENCE,
        "roles": [
            {"value": "finance", "role": "finance"},
            {"value": "vision-members", "role": "member", "team": "vision"},
            {"value": "vision-leads", "role": "team-lead", "team": "vision"},
        ],
        "dashboard": {"client_id": CLIENT_ID},
    }
    config = a_config_dict(
        auth={"oidc": oidc},
        dashboard={"host": "127.0.0.1", "port": port, "job_templates": [TEMPLATE]},
        scheduler={"host": "127.0.0.1", "port": api.port},
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


def _open(page: Any, title: str) -> None:
    page.locator('[data-testid="stSidebarNav"] a').filter(has_text=title).click()
    page.get_by_role("heading", name=title, exact=True).wait_for()


def test_a_lead_files_a_request_finance_approves_it_and_the_lead_sees_it(
    browser, login_dashboard, issuer, api
):
    lead = _sign_in(browser, login_dashboard, issuer, LEAD)
    try:
        assert _pages(lead) == ["Team", "My jobs", "Requests"]
        _open(lead, "Requests")
        lead.get_by_role("textbox", name="Change (negative gives back)").fill("500")
        lead.get_by_role("textbox", name="Reason", exact=True).fill(
            "the detection sweep needs more"
        )
        lead.get_by_role("button", name="File request").click()
        lead.get_by_text("Filed ").wait_for()
        request_id = lead.get_by_text("Filed ").inner_text().split()[1].rstrip(":")
        opened = api.rig.requests.states[request_id].opened
        assert (opened.team, opened.actor, opened.amount) == (
            "vision",
            "team-lead:oidc:lee",
            500_000_000,
        )
        assert lead.get_by_role("button", name="Approve").count() == 0  # a lead decides nothing
        finance = _sign_in(browser, login_dashboard, issuer, FINANCE)
        try:
            finance.get_by_role("heading", name="Finance: GPU cost").wait_for()
            assert _pages(finance) == [
                "Finance",
                "Platform",
                "Team",
                "Capacity planning",
                "What-if",
                "Audit",
                "Requests",
            ]
            assert finance.get_by_role("button", name="Deploy").count() == 0
            _open(finance, "Requests")
            finance.get_by_role("textbox", name="Comment", exact=True).fill(
                "within the quarter's plan"
            )
            finance.get_by_role("button", name="Approve").click()
            finance.get_by_text(f"{request_id} is approved").wait_for()
            assert finance.locator('[data-testid="stException"]').count() == 0
        finally:
            finance.context.close()
        state = api.rig.requests.states[request_id]
        assert (state.status.value, state.decided_by, state.comment) == (
            "approved",
            "finance:oidc:bo",
            "within the quarter's plan",
        )
        _open(lead, "My jobs")  # the lead's view: the team's requests with their status
        row = lead.locator('[data-testid="stTable"] tr').filter(has_text=request_id)
        row.wait_for()
        assert "approved" in row.inner_text() and "within the quarter's plan" in row.inner_text()
        assert lead.locator('[data-testid="stException"]').count() == 0
    finally:
        lead.context.close()


def _job_row(page: Any, job_id: str) -> Any:
    return page.locator('[data-testid="stTable"] tr').filter(has_text=job_id)


def test_a_member_signs_in_sees_their_team_and_submits_watches_and_cancels_a_job(
    browser, login_dashboard, issuer, api, seeded_ledger
):
    page = _sign_in(browser, login_dashboard, issuer, MEMBER)
    try:
        page.get_by_role("heading", name="Team: jobs, budget and quota").wait_for()
        page.get_by_text("Team vision").first.wait_for()
        assert page.get_by_text("member of vision").count() == 1
        assert _pages(page) == ["Team", "My jobs", "Requests"]  # no Finance, no other team
        assert page.get_by_role("button", name="Deploy").count() == 0
        # the portal, calling the API with the member's forwarded access token
        page.locator('[data-testid="stSidebarNav"] a').filter(has_text="My jobs").click()
        page.get_by_role("heading", name="My jobs").wait_for()
        page.get_by_role("button", name="Submit job").click()
        page.get_by_text("Submitted ").wait_for()
        job_id = page.get_by_text("Submitted ").inner_text().split()[1]
        record = api.rig.dispatcher.records[job_id]
        assert (record.spec.team, record.spec.user, record.spec.queue) == ("vision", "ada", "dev")
        assert record.spec.estimated_runtime_us == 1_800_000_000  # the template's 0.5 h
        work = api.rig.dispatcher.work_for(job_id)
        assert work is not None and work.command == tuple(TEMPLATE["command"])
        for _ in range(50):  # the scheduler places it within a tick or two
            page.get_by_role("button", name="Refresh").click()
            if "running" in _job_row(page, job_id).inner_text():
                break
            page.wait_for_timeout(200)
        assert "running" in _job_row(page, job_id).inner_text()
        page.get_by_role("button", name="Cancel job").click()
        page.get_by_text(f"Cancelled {job_id}").wait_for()
        assert api.rig.dispatcher.records[job_id].state.value == "cancelled"
        assert page.locator('[data-testid="stException"]').count() == 0
        # a template of their own: save the form (now 2 GPUs), submit from it, delete it
        page.get_by_role("spinbutton", name="GPUs", exact=True).fill("2")
        page.get_by_role("textbox", name="Save as my template, named").fill("two gpus")
        page.get_by_role("button", name="Save as my template").click()
        page.get_by_text("Saved your template two gpus").wait_for()
        assert [
            t.gpus
            for t in TemplateStore(seeded_ledger.parent / "dashboard" / "templates").mine(ADA)
        ] == [2]
        before = set(api.rig.dispatcher.records)
        page.get_by_role("button", name="Submit job").click()
        page.get_by_text("Submitted ").wait_for()
        (mine,) = set(api.rig.dispatcher.records) - before
        spec = api.rig.dispatcher.records[mine].spec
        assert (spec.user, spec.gpus, spec.queue) == ("ada", 2, "dev")
        page.get_by_role("button", name="Delete my template two gpus").click()
        page.get_by_text("Deleted your template two gpus").wait_for()
        assert TemplateStore(seeded_ledger.parent / "dashboard" / "templates").mine(ADA) == ()
        # the sidebar's language switch (its last select box): the portal in Chinese
        page.locator('[data-testid="stSidebar"] [data-testid="stSelectbox"]').last.click()
        page.get_by_role("option", name="简体中文").click()
        page.get_by_role("heading", name="我的作业").wait_for()
        page.get_by_role("button", name="提交作业").wait_for()
        assert _pages(page) == ["团队", "我的作业", "申请"]
        assert page.locator('[data-testid="stException"]').count() == 0
        _open(page, "申请")  # the Requests page in Chinese too
        page.get_by_role("button", name="提交申请").wait_for()
        assert page.locator('[data-testid="stException"]').count() == 0
    finally:
        page.context.close()
