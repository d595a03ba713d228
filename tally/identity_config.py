"""The `identity:` section of the configuration: who a job or a process is.

os_users         Tally user → OS user the executors run its jobs as (`tally.os_users_config`)
slurm_accounts   Slurm account → {team, project}; read in reverse by the Slurm executor,
                 which submits a team's jobs with `--account=` the first account of that
                 team (`slurm_account_of_team`)
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import Field

from tally.config_fields import Name, Strict
from tally.os_users_config import OsUsersConfig


class SlurmAccountConfig(Strict):
    team: Name
    project: Name | None = None


class IdentityConfig(Strict):
    os_users: OsUsersConfig = OsUsersConfig()
    slurm_accounts: dict[str, SlurmAccountConfig] = Field(default_factory=dict)


def slurm_account_of_team(accounts: Mapping[str, SlurmAccountConfig]) -> dict[str, str]:
    """Team → the first Slurm account (in the file's order) mapped to it."""
    out: dict[str, str] = {}
    for account, owner in accounts.items():
        out.setdefault(owner.team, account)
    return out
