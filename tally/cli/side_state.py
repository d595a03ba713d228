"""The side files of the ledger — admin log, inventory, audit trail, identity — for the
commands that read nothing else of it (`tally admin apply`, `tally request …`, `tally ledger
close`, `tally inventory list|cordon|uncordon`, `tally audit`), parsed into what they read.

From `--data-dir` or the config's `ledger.data_dir` as it is; with `ledger.segments_url` set,
straight from the object store: the published head(s) and the files they name
(`ledger.store.side_pull`), never the whole sealed ledger a report's read cache pulls
(`tally.cli.options.reader_directory`) — a fresh pod downloads a few kilobytes, not every
segment. Either way the command reads the same bytes a read cache would hold.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import tzinfo
from pathlib import Path
from typing import NoReturn, TypeVar

from ledger.admin import AdminView
from ledger.audit import AuditRecord
from ledger.errors import LedgerError
from ledger.inventory import InventoryGpu
from ledger.store.identity import IDENTITY_NAME, zone_of_record
from ledger.store.layout import has_ledger
from ledger.store.side_files import (
    ADMIN_LOG_PATH,
    AUDIT_PATH,
    INVENTORY_PATH,
    parse_admin_log,
    parse_audit,
    parse_inventory,
)
from tally.cli.options import DEFAULT_CONFIG, Exit, fail, load_or_exit
from tally.config import ConfigError
from tally.language import _

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class SideFiles:
    """Side files of one ledger by their path in a data directory (absent: the ledger has no
    such file), read from `where` (a directory, or an object store's URL); `url`: the
    configured `ledger.segments_url` they were read from (None: a directory). `found`: False
    where there is no ledger (and the caller allowed that: no files)."""

    where: str
    files: Mapping[str, bytes] = field(default_factory=dict)
    sources: Mapping[str, str] = field(default_factory=dict)
    url: str | None = None
    found: bool = True

    def describe(self, path: str) -> str:
        """Where the file at `path` was read from, for messages."""
        return f"{self.sources.get(path, self.where)}/{path}"

    def admin_view(self) -> AdminView:
        """The admin state the worker applied (none yet: empty)."""
        return AdminView.from_log(self._parsed(ADMIN_LOG_PATH, parse_admin_log, []))

    def inventory(self) -> list[InventoryGpu]:
        """The GPU inventory as of the last seal, by node and index (none yet: empty)."""
        return self._parsed(INVENTORY_PATH, parse_inventory, [])

    def audit(self) -> list[AuditRecord]:
        """The audit trail as of the last seal, oldest first (none yet: empty)."""
        return self._parsed(AUDIT_PATH, parse_audit, [])

    def zone(self) -> tzinfo:
        """The time zone the ledger keeps its books in (UTC where none is recorded)."""
        try:
            return zone_of_record(self.files.get(IDENTITY_NAME), self.describe(IDENTITY_NAME))
        except LedgerError as exc:
            self._unreadable(exc)

    def _parsed(self, path: str, parse: Callable[[bytes, str], T], absent: T) -> T:
        raw = self.files.get(path)
        if raw is None:
            return absent
        try:
            return parse(raw, self.describe(path))
        except LedgerError as exc:
            self._unreadable(exc)

    def _unreadable(self, exc: BaseException) -> NoReturn:
        if self.url is None:
            fail(str(exc), Exit.LEDGER)
        fail(cannot_read(self.url, exc), Exit.LEDGER)


def cannot_read(url: str, problem: BaseException) -> str:
    return _("the sealed ledger at {url} cannot be read: {problem}").format(
        url=url, problem=problem
    )


def read_side(
    config_path: str | None,
    data_dir: str | None,
    paths: Sequence[str],
    *,
    missing_ok: bool = False,
) -> SideFiles:
    """The files at `paths` (relative to a data directory) of the ledger `--data-dir` (else the
    config's) names. No ledger there (no writer's database or postings manifest; on an object
    store no head, no shard): exit `Exit.LEDGER`, or with `missing_ok` no files (`found`
    False); a ledger that cannot be read: exit `Exit.LEDGER`; a credential variable not set:
    `Exit.USAGE`."""
    if data_dir:
        return _local(Path(data_dir), paths, missing_ok)
    config = load_or_exit(config_path or DEFAULT_CONFIG)
    ledger = config.ledger
    from tally.segments_config import segments_store

    try:
        store = segments_store(ledger.segments_url, ledger.object_store)
    except ConfigError as exc:
        fail(str(exc), Exit.USAGE)
    if store is None or ledger.segments_url is None:
        return _local(ledger.data_dir, paths, missing_ok)
    from ledger.store.side_pull import pull_side

    where = store.describe()
    try:
        side = pull_side(store, paths)
    except (OSError, LedgerError) as exc:
        fail(cannot_read(ledger.segments_url, exc), Exit.LEDGER)
    if side is None:
        return _missing(where, missing_ok)
    return SideFiles(where, side.files, side.where, ledger.segments_url)


def _local(directory: Path, paths: Sequence[str], missing_ok: bool) -> SideFiles:
    if not has_ledger(directory):
        return _missing(str(directory), missing_ok)
    files: dict[str, bytes] = {}
    for path in paths:
        try:
            files[path] = (directory / path).read_bytes()
        except FileNotFoundError:
            continue
        except OSError as exc:
            fail(str(exc), Exit.LEDGER)
    return SideFiles(str(directory), files)


def _missing(where: str, missing_ok: bool) -> SideFiles:
    if not missing_ok:
        fail(_("no ledger at {directory}").format(directory=where), Exit.LEDGER)
    return SideFiles(where, found=False)
