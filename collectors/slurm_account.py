"""Slurm accounts: which account a Slurm job runs under, and which team and project that is.

This module owns the account side of a Slurm job's identity (`collectors.ownership` asks it for
jobs Tally did not submit, i.e. processes without `TALLY_JOB_ID`):

- `parse_scontrol_account(text)`: the `Account=` of `scontrol show job <id>` output (multi-line
  or `-o` one-line), or None (`(null)`, no such field);
- `SlurmAccounts`: asks Slurm (`<command> show job <id>`) with a timeout and keeps each job's
  answer in a bounded cache (a job's account never changes). A missing binary (a host without
  Slurm) is not an error: it is logged once and the account stays unknown. A timeout or a
  failing command is logged and not cached, so a later round asks again;
- `account_owner(account, accounts)`: the (team, project) the configuration maps an account to;
  an account the configuration does not name is the visible team `unmapped:<account>`, never
  unallocated, so `tally report cost` shows whom to add to `identity.slurm_accounts`.
"""

from __future__ import annotations

import logging
import re
import subprocess
from collections import OrderedDict
from collections.abc import Mapping, Sequence

log = logging.getLogger("tally.collector.slurm")

UNMAPPED_PREFIX = "unmapped:"
MAX_ACCOUNT_CHARS = 64
AccountOwners = Mapping[str, tuple[str, str | None]]
"""account → (team, project) from `identity.slurm_accounts`."""

_ACCOUNT = re.compile(r"(?:^|\s)Account=(\S*)")
_JOB_ID = re.compile(r"^[0-9]+(?:[_+][0-9]+)?$")  # 123, array task 123_4, het component 123+0


def parse_scontrol_account(text: str) -> str | None:
    """The job's account from `scontrol show job` output, or None when it names none."""
    match = _ACCOUNT.search(text)
    if match is None:
        return None
    account = match.group(1)
    if not account or account == "(null)" or len(account) > MAX_ACCOUNT_CHARS:
        return None
    return account


def account_owner(account: str, accounts: AccountOwners) -> tuple[str, str | None]:
    """(team, project) of a Slurm account: the configured mapping, else `unmapped:<account>`."""
    mapped = accounts.get(account)
    if mapped is not None:
        return mapped
    return f"{UNMAPPED_PREFIX}{account}", None


class SlurmAccounts:
    """Call it as `accounts(slurm_job_id)`: the job's Slurm account, or None when unknown.

    `command` is the scontrol executable and any leading arguments (`("scontrol",)`); the job
    id is appended after `show job`. At most `max_cached` jobs are remembered (oldest first out).
    """

    __slots__ = ("_cache", "_command", "_max_cached", "_missing", "_timeout_s")

    def __init__(
        self,
        command: Sequence[str] = ("scontrol",),
        *,
        timeout_s: float = 5.0,
        max_cached: int = 4096,
    ) -> None:
        if not command:
            raise ValueError("command must name the scontrol executable")
        if timeout_s <= 0 or max_cached < 1:
            raise ValueError("timeout_s and max_cached must be positive")
        self._command = tuple(command)
        self._timeout_s = timeout_s
        self._max_cached = max_cached
        self._cache: OrderedDict[str, str | None] = OrderedDict()
        self._missing = False

    def __call__(self, job_id: str) -> str | None:
        if self._missing or not _JOB_ID.match(job_id):
            return None
        if job_id in self._cache:
            self._cache.move_to_end(job_id)
            return self._cache[job_id]
        try:
            done = subprocess.run(
                [*self._command, "show", "job", job_id],
                capture_output=True,
                timeout=self._timeout_s,
                check=False,
            )
        except FileNotFoundError:
            self._missing = True
            log.info("%s not found: Slurm accounts come from job environments", self._command[0])
            return None
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.warning("scontrol show job %s failed: %s", job_id, exc)
            return None
        if done.returncode != 0:  # e.g. "Invalid job id specified": the job is gone
            account = None
        else:
            account = parse_scontrol_account(done.stdout.decode("utf-8", "replace"))
        self._cache[job_id] = account
        if len(self._cache) > self._max_cached:
            self._cache.popitem(last=False)
        return account
