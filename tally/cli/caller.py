"""The CLI's caller for the admin events it writes: `--token` / $TALLY_TOKEN, resolved against
the configured tokens (`scheduler.tokens`, the API's own), then the permission table
(`ledger.roles`) — the same decision the API and the ledger make.

Without a token the caller is the local operator, who can read the configuration and write the
admin topic: its events carry no role and the ledger applies them as the admin's (the trust
model is in docs/architecture.md, "Roles and permissions"). With a token, each event is checked
before anything is sent (a refused one: exit 2, nothing sent) and records the token's role, so
the ledger checks it again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import click

from ledger.admin import ACTION_OF, AdminEvent
from ledger.roles import Caller, admin_event_refusal
from tally.cli.options import Exit, fail
from tally.config import ConfigError, TallyConfig

admin_token_option = click.option(
    "--token",
    envvar="TALLY_TOKEN",
    default=None,
    help="Act with this token's role (default: $TALLY_TOKEN; none: the local operator, as admin).",
)


def token_caller(config: TallyConfig, token: str) -> Caller:
    """Who `token` is among the configured tokens; exit 2 if none."""
    from tally.scheduling import load_tokens

    try:
        tokens = load_tokens(config)
    except ConfigError as exc:
        fail(f"cannot check the token: {exc}", Exit.USAGE)
    caller = tokens.principal(token)
    if caller is None:
        fail("the token is not one of the configured tokens (scheduler.tokens)", Exit.USAGE)
    return caller


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
            fail(f"refused for {caller.name}: {problem}; nothing was sent", Exit.USAGE)
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
