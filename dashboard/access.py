"""Who is looking at the dashboard, and what they may see.

With single sign-on configured (`$TALLY_OIDC_LOGIN`, the claim mapping `tally` hands over from
`auth.oidc`), a person signs in through Streamlit's OIDC login (`st.login`; the `[auth]`
secrets `tally` writes) and `st.user`'s claims are mapped to a role and team by the same rules
as the API's bearer tokens (`ledger.role_claims`). `visible_pages` derives the pages a role sees
from the permission table (`ledger.roles`): the money pages need every team's balances and
jobs, the fleet pages every team's jobs, the Team page its team's; a team role sees its own
team only (`Viewer.team`); members and team leads also get the self-service portal ("My jobs",
`dashboard.page_portal`), and every role that may read quota and budget requests gets the
Requests page (`dashboard.page_requests`; a team role its team's). Without single sign-on
everyone sees everything, as before, and there is neither portal nor Requests page (both act as
the signed-in person).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import streamlit as st

from dashboard import i18n
from dashboard.i18n import _
from ledger.role_claims import ClaimMapping
from ledger.roles import Action, Caller, Role, Scope, scope_of

LOGIN_ENV = "TALLY_OIDC_LOGIN"
ANY = frozenset({Scope.ANY})
SOME = frozenset(Scope)

# page (its url path) → the actions and scopes a role needs to see it
PAGE_NEEDS: Mapping[str, Mapping[Action, frozenset[Scope]]] = {
    "finance": {Action.BALANCES_READ: ANY, Action.JOB_READ: ANY},
    "platform": {Action.INVENTORY_READ: ANY, Action.JOB_READ: ANY},
    "team": {Action.BALANCES_READ: SOME, Action.JOB_READ: SOME},
    "capacity": {Action.QUEUES_READ: ANY, Action.JOB_READ: ANY},
    "whatif": {Action.BALANCES_READ: ANY, Action.JOB_READ: ANY},
    "audit": {Action.BALANCES_READ: ANY, Action.JOB_READ: ANY},
}
# the self-service portal: for a role that submits and cancels within its team (members and
# team leads), and only with single sign-on (it calls the API as the signed-in person)
PORTAL = "jobs"
PORTAL_NEEDS: Mapping[Action, frozenset[Scope]] = {
    Action.JOB_SUBMIT: frozenset({Scope.TEAM, Scope.OWN}),
    Action.JOB_CANCEL: frozenset({Scope.TEAM, Scope.OWN}),
}
# quota and budget requests: for a role that reads them (a team role: its team's), with single
# sign-on only (the page files and decides them as the signed-in person)
REQUESTS = "requests"
REQUESTS_NEEDS: Mapping[Action, frozenset[Scope]] = {Action.REQUEST_READ: SOME}


def _allowed(role: Role, needs: Mapping[Action, frozenset[Scope]]) -> bool:
    return all(scope_of(role, action) in scopes for action, scopes in needs.items())


def visible_pages(role: Role) -> frozenset[str]:
    """The pages `role` may see when signed in (their url paths), the portal and the Requests
    page included."""
    pages = {page for page, needs in PAGE_NEEDS.items() if _allowed(role, needs)}
    pages |= {PORTAL} if _allowed(role, PORTAL_NEEDS) else set()
    return frozenset(pages | ({REQUESTS} if _allowed(role, REQUESTS_NEEDS) else set()))


@dataclass(frozen=True, slots=True)
class Viewer:
    """Who is looking: None as caller without single sign-on (everything is shown)."""

    caller: Caller | None = None

    @property
    def pages(self) -> frozenset[str]:
        return frozenset(PAGE_NEEDS) if self.caller is None else visible_pages(self.caller.role)

    @property
    def team(self) -> str | None:
        """The one team shown (None: every team)."""
        return self.caller.team if self.caller is not None else None


def login_mapping() -> ClaimMapping | None:
    """The claim mapping of the configured single sign-on; None: not configured."""
    text = os.environ.get(LOGIN_ENV)
    return ClaimMapping.from_json(text) if text else None


def signed_in() -> Caller | None:
    """The signed-in person's role and team (None: no single sign-on, or no role)."""
    mapping = login_mapping()
    return None if mapping is None else mapping.caller(st.user.to_dict())


def subject() -> str | None:
    """The signed-in person's OIDC subject (`sub`: the issuer's stable id for them, never
    reassigned); None when not signed in or the login names none."""
    sub = st.user.to_dict().get("sub")
    return sub if isinstance(sub, str) and sub else None


def viewer() -> Viewer:
    """The person looking at the dashboard. Without a login, or without a role, this shows the
    login screen (or the refusal) and stops the page run: nothing of the ledger is read."""
    mapping = login_mapping()
    if mapping is None:
        return Viewer()
    claims = st.user.to_dict()
    if not claims.get("is_logged_in"):
        st.title("Tally")
        st.write(_("Sign in with your organisation's account to see the dashboard."))
        st.button(_("Log in"), type="primary", on_click=st.login)
        i18n.switch()
        st.stop()
    caller = mapping.caller(claims)
    if caller is None:
        st.title("Tally")
        st.error(
            _(
                "You are signed in, but your account has no role in Tally: ask an administrator "
                "to add you to a group that `auth.oidc.roles` maps to a role."
            )
        )
        st.button(_("Log out"), on_click=st.logout)
        i18n.switch()
        st.stop()
    with st.sidebar:
        who = {"user": caller.user, "role": caller.role, "team": caller.team}
        st.caption(
            _("Signed in as **{user}** · {role} of {team}").format(**who)
            if caller.team
            else _("Signed in as **{user}** · {role}").format(**who)
        )
        st.button(_("Log out"), on_click=st.logout)
    return Viewer(caller)
