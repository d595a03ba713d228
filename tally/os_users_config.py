"""`identity.os_users` of the configuration: which OS user each Tally user's jobs run as (see
`scheduler.executors.run_as` for what the executors do with it).

    identity:
      os_users:
        users: {alice: alice, bob: bsmith}   # Tally user → OS user name
        default: null                        # the OS user of every other Tally user
        unmapped_as_scheduler: false         # no entry, no default: run as the scheduler's
                                             # own user (true) or refuse the job (false)

Nothing configured (no users, no default): every job runs as the scheduler's own user.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BeforeValidator, Field

from ledger.invalid import Invalid
from scheduler.executors.run_as import OsUsers
from tally.config_fields import Strict

# POSIX portable user names (and what useradd accepts): no ':' or '/', no leading '-'
_OS_USER = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_.-]{0,31}\$?$")


def _os_user(value: Any) -> str:
    if not isinstance(value, str) or not _OS_USER.match(value):
        raise Invalid(
            "{value!r} is not an OS user name (letters, digits, '_', '.', '-', at most 32)",
            value=value,
        )
    return value


OsUserName = Annotated[str, BeforeValidator(_os_user)]


class OsUsersConfig(Strict):
    """`users`: Tally user → OS user; `default`: the OS user of the rest; with neither,
    `unmapped_as_scheduler` says whether such a job runs as the scheduler's own user."""

    users: dict[str, OsUserName] = Field(default_factory=dict, max_length=100_000)
    default: OsUserName | None = None
    unmapped_as_scheduler: bool = False

    def mapping(self) -> OsUsers:
        return OsUsers(dict(self.users), self.default, self.unmapped_as_scheduler)
