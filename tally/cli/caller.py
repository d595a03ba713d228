"""The CLI's caller for the admin events it writes: `--token` / $TALLY_TOKEN, resolved against
the configured tokens (`scheduler.tokens`, the API's own) — or, for a JWT with `auth.oidc`
configured, verified against the issuer as the API does — then the permission table
(`ledger.roles`): the same decision the API and the ledger make.

Without a token the caller is the local operator, who can read the configuration and write the
admin topic: its events carry no role and the ledger applies them as the admin's (the trust
model is in docs/architecture.md, "Roles and permissions"). With a token, each event is checked
before anything is sent (a refused one: exit 2, nothing sent) and records the token's role, so
the ledger checks it again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

import click

from ledger.admin import ACTION_OF, AdminEvent
from ledger.roles import Caller, admin_event_refusal
from tally.cli.options import Exit, fail
from tally.config import ConfigError, TallyConfig
from tally.language import _

if TYPE_CHECKING:
    from scheduler.api.oidc import OidcVerifier

admin_token_option = click.option(
    "--token",
    envvar="TALLY_TOKEN",
    default=None,
    help="Act with this token's role (default: $TALLY_TOKEN; none: the local operator, as admin).",
)


def token_caller(config: TallyConfig, token: str) -> Caller:
    """Who `token` is among the configured tokens (a JWT: the person the OIDC issuer says);
    exit 2 if none."""
    from scheduler.api.oidc import looks_like_jwt
    from tally.scheduling import load_tokens, oidc_verifier

    verifier = oidc_verifier(config)
    if verifier is not None and looks_like_jwt(token):
        return _person(verifier, token)

    try:
        tokens = load_tokens(config)
    except ConfigError as exc:
        fail(_("cannot check the token: {problem}").format(problem=exc), Exit.USAGE)
    caller = tokens.principal(token)
    if caller is None:
        fail(_("the token is not one of the configured tokens (scheduler.tokens)"), Exit.USAGE)
    return caller


def _person(verifier: OidcVerifier, token: str) -> Caller:
    import asyncio

    from scheduler.api import ApiError

    try:
        return asyncio.run(verifier.caller(token))
    except ApiError as exc:
        fail(_("the OIDC token is refused: {problem}").format(problem=exc.message), Exit.USAGE)


def with_role(caller: Caller, events: Sequence[AdminEvent]) -> list[AdminEvent]:
    """`events` stamped with the caller's role; exit 2 (nothing sent) if its role may not make
    one of them."""
    stamped: list[AdminEvent] = []
    for event in events:
        action = ACTION_OF.get(event.KIND)
        problem = (
            f"{event.KIND} is the ledger's own"
            if action is None
            else admin_event_refusal(action, caller.role)
        )
        if problem is not None:
            fail(
                _("refused for {caller}: {problem}; nothing was sent").format(
                    caller=caller.name, problem=problem
                ),
                Exit.USAGE,
            )
        stamped.append(dataclasses.replace(event, role=caller.role))
    return stamped


def as_caller(
    config: TallyConfig, token: str | None, events: Sequence[AdminEvent]
) -> list[AdminEvent]:
    """The events to send for the CLI's caller: unchanged without a token, else checked and
    stamped with its role."""
    if not token:
        return list(events)
    return with_role(token_caller(config, token), events)
