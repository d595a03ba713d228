"""The admin state the worker has applied — its admin log and the ledger's time zone, as the last
seal exported them — for the commands that read nothing else of the ledger (`tally admin
apply`, `tally request …`, `tally ledger close`).

From `--data-dir` or the config's `ledger.data_dir` as it is; with `ledger.segments_url` set,
straight from the object store: the published head(s) and the two files they name
(`ledger.store.side_pull`), never the whole sealed ledger a report's read cache pulls
(`tally.cli.options.reader_directory`) — a fresh pod running `admin apply` downloads a few
kilobytes, not every segment.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, tzinfo
from pathlib import Path

from ledger.admin import AdminView
from ledger.errors import LedgerError
from ledger.store.identity import IDENTITY_NAME, recorded_zone, zone_of_record
from ledger.store.layout import SEGMENTS_DIR, has_ledger
from ledger.store.side_files import ADMIN_LOG_NAME, load_admin_log, parse_admin_log
from tally.cli.options import DEFAULT_CONFIG, Exit, fail, load_or_exit
from tally.config import ConfigError
from tally.language import _

ADMIN_LOG_PATH = f"{SEGMENTS_DIR}/{ADMIN_LOG_NAME}"


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
    that says so (`found`); a ledger
    that cannot be read: exit `Exit.LEDGER`; a credential variable not set: `Exit.USAGE`."""
    if data_dir:
        return _local(Path(data_dir), missing_ok)
    config = load_or_exit(config_path or DEFAULT_CONFIG)
    ledger = config.ledger
    from tally.segments_config import segments_store

    try:
        store = segments_store(ledger.segments_url, ledger.object_store)
    except ConfigError as exc:
        fail(str(exc), Exit.USAGE)
    if store is None:
        return _local(ledger.data_dir, missing_ok)
    from ledger.store.side_pull import pull_side

    where = store.describe()
    try:
        side = pull_side(store, [ADMIN_LOG_PATH, IDENTITY_NAME])
        if side is None:
            return _missing(where, missing_ok)
        log = side.get(ADMIN_LOG_PATH)
        events = [] if log is None else parse_admin_log(log, side.describe(ADMIN_LOG_PATH))
        zone = zone_of_record(side.get(IDENTITY_NAME), side.describe(IDENTITY_NAME))
        return AdminState(where, AdminView.from_log(events), zone)
    except (OSError, LedgerError) as exc:
        fail(
            _("the sealed ledger at {url} cannot be read: {problem}").format(
                url=ledger.segments_url, problem=exc
            ),
            Exit.LEDGER,
        )


def _local(directory: Path, missing_ok: bool) -> AdminState:
    if not has_ledger(directory):
        return _missing(str(directory), missing_ok)
    try:
        events = load_admin_log(directory / SEGMENTS_DIR)
        return AdminState(str(directory), AdminView.from_log(events), recorded_zone(directory))
    except LedgerError as exc:
        fail(str(exc), Exit.LEDGER)


def _missing(where: str, missing_ok: bool) -> AdminState:
    if not missing_ok:
        fail(_("no ledger at {directory}").format(directory=where), Exit.LEDGER)
    return AdminState(where, found=False)
