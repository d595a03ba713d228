"""The admin state the worker has applied — its admin log and the ledger's time zone, as the last
seal exported them — for the commands that read nothing else of the ledger (`tally admin
apply`, `tally request …`, `tally ledger close`).

Read as `tally.cli.side_state` reads side files: from `--data-dir` or the config's
`ledger.data_dir` as it is; with `ledger.segments_url` set, straight from the object store (the
published head(s) and the two files they name, `ledger.store.side_pull`), never the whole
sealed ledger a report's read cache pulls — a fresh pod running `admin apply` downloads a few
kilobytes, not every segment.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, tzinfo

from ledger.admin import AdminView
from ledger.store.identity import IDENTITY_NAME
from ledger.store.side_files import ADMIN_LOG_PATH
from tally.cli.side_state import read_side

__all__ = ["ADMIN_LOG_PATH", "AdminState", "read_admin_state"]


@dataclass(frozen=True, slots=True)
class AdminState:
    """What the worker has applied (`view`), the time zone the ledger keeps its books in, and
    where they were read (a directory or a store's URL, for messages). `found`: False where
    there is no ledger yet (and the caller allowed that: an empty state)."""

    where: str
    view: AdminView = field(default_factory=AdminView)
    zone: tzinfo = UTC
    found: bool = True


def read_admin_state(
    config_path: str | None, data_dir: str | None, *, missing_ok: bool = False
) -> AdminState:
    """The admin state of the ledger `--data-dir` (else the config's) names. No ledger there
    (no postings manifest, no shard): exit `Exit.LEDGER`, or with `missing_ok` an empty state
    that says so (`found`); a ledger that cannot be read: exit `Exit.LEDGER`; a credential
    variable not set: `Exit.USAGE`."""
    side = read_side(config_path, data_dir, [ADMIN_LOG_PATH, IDENTITY_NAME], missing_ok=missing_ok)
    if not side.found:
        return AdminState(side.where, found=False)
    return AdminState(side.where, side.admin_view(), side.zone())
