"""Which OS user a job runs as: its submitter's, through `identity.os_users`.

`run_as` is the pure decision (the scheduler's uid, the mapping, the job's Tally user and the
OS accounts it may name → `RunAs`, `Refusal`, or None for "as the scheduler itself");
`Passwd` and `account_of` read the accounts from this host (`pwd`, `os.getgrouplist`).

The rules, in order:
- no mapping configured (no users, no default): every job runs as the scheduler's own user,
  as before there was a mapping;
- the Tally user's OS user is its entry in `users`, else `default`; a user with neither is
  refused, unless `unmapped_as_scheduler` lets it run as the scheduler's own user;
- an OS user this host does not know is refused;
- running as root, the scheduler drops to the OS user (setgid, initgroups, setuid in the
  child, before exec), unless that user is root itself; not running as root, it runs the job
  only when the OS user is the one it runs as, and refuses it otherwise — a job never runs as
  a user other than its submitter's.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

ROOT_UID = 0


@dataclass(frozen=True, slots=True)
class OsUsers:
    """`identity.os_users`: Tally user → OS user name, a default for the others, and whether
    an unmapped user may run as the scheduler's own user (when there is no default)."""

    users: Mapping[str, str] = field(default_factory=dict)
    default: str | None = None
    unmapped_as_scheduler: bool = False

    @property
    def configured(self) -> bool:
        return bool(self.users) or self.default is not None


NO_OS_USERS = OsUsers()


@dataclass(frozen=True, slots=True)
class OsAccount:
    """One OS user as the host knows it; `groups`: its supplementary groups (initgroups)."""

    name: str
    uid: int
    gid: int
    home: str
    groups: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class RunAs:
    """Start the job as `account` (the scheduler is root and drops to it in the child)."""

    tally_user: str
    account: OsAccount

    def environment(self) -> dict[str, str]:
        """What a login would set: HOME, USER and LOGNAME of the account."""
        return {"HOME": self.account.home, "USER": self.account.name, "LOGNAME": self.account.name}


@dataclass(frozen=True, slots=True)
class Refusal:
    """The job must not run here; `reason` is what its failure says."""

    reason: str


def os_user_name(os_users: OsUsers, tally_user: str) -> str | None:
    """The OS user `tally_user` maps to (its own entry, else the default), None if neither."""
    return os_users.users.get(tally_user, os_users.default)


def run_as(
    current_uid: int,
    os_users: OsUsers,
    tally_user: str,
    accounts: Mapping[str, OsAccount],
) -> RunAs | Refusal | None:
    """How a job of `tally_user` runs on a host where the scheduler has `current_uid`; None:
    as the scheduler's own user. See the module's rules."""
    if not os_users.configured:
        return None
    name = os_user_name(os_users, tally_user)
    if name is None:
        if os_users.unmapped_as_scheduler:
            return None
        return Refusal(
            f"Tally user {tally_user!r} has no OS user in identity.os_users (and no default): "
            "refused rather than run as the scheduler's own user"
        )
    account = accounts.get(name)
    if account is None:
        return Refusal(f"OS user {name!r} (for Tally user {tally_user!r}) does not exist here")
    if account.uid == current_uid:
        return None
    if current_uid == ROOT_UID:
        return RunAs(tally_user, account)
    return Refusal(
        f"the scheduler runs as uid {current_uid}, not root, so it cannot run a job of "
        f"{tally_user!r} as OS user {name!r} (uid {account.uid}): refused rather than run as "
        "the wrong user"
    )


# ---------------------------------------------------------------------------- this host


def account_of(name: str) -> OsAccount | None:
    """The account `name` on this host (passwd and its groups), None if there is none."""
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return None
    groups = tuple(sorted(set(os.getgrouplist(entry.pw_name, entry.pw_gid))))
    return OsAccount(entry.pw_name, entry.pw_uid, entry.pw_gid, entry.pw_dir, groups)


class Passwd(Mapping[str, OsAccount]):
    """This host's accounts as a mapping, read one name at a time (never listed)."""

    def __getitem__(self, name: str) -> OsAccount:
        account = account_of(name)
        if account is None:
            raise KeyError(name)
        return account

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


def decide(os_users: OsUsers, tally_user: str) -> RunAs | Refusal | None:
    """`run_as` for this process on this host."""
    if not os_users.configured:
        return None
    return run_as(os.geteuid(), os_users, tally_user, Passwd())
