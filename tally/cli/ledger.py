"""`tally ledger …`: inspect and maintain the ledger. The group and `seal` are here; the checks
(`verify`, `rebuild`) are `tally.cli.ledger_checks`', the ledger's admin events (`adjust`,
`close`) `tally.cli.ledger_admin`'s."""

from __future__ import annotations

import click

from ledger.errors import LedgerError
from tally.cli.help import Group
from tally.cli.ledger_admin import adjust, close
from tally.cli.ledger_checks import rebuild, verify
from tally.cli.options import (
    Exit,
    config_option,
    data_dir_option,
    fail,
    load_or_exit,
    resolve_ledger_dir,
)


@click.group(cls=Group)
def ledger() -> None:
    """Inspect and maintain the ledger."""


ledger.add_command(verify)
ledger.add_command(adjust)
ledger.add_command(close)
ledger.add_command(rebuild)


@ledger.command()
@config_option
@data_dir_option
def seal(config_path: str, data_dir: str | None) -> None:
    """Seal committed rows into Parquet segments now (the worker must not be running)."""
    from ledger.store.hot import DuckDBStore
    from ledger.store.published import PublishedStore
    from tally.segments_config import publisher

    directory = resolve_ledger_dir(config_path, data_dir, replica=False)
    ledger_config = load_or_exit(config_path).ledger if data_dir is None else None
    try:
        to = (
            None
            if ledger_config is None
            else publisher(directory, ledger_config.segments_url, ledger_config.object_store)
        )
        with DuckDBStore(directory) if to is None else PublishedStore(directory, to) as store:
            result = store.seal()
    except LedgerError as exc:
        fail(str(exc), Exit.LEDGER)
    click.echo(f"sealed {len(result.sealed)} segments, compacted into {len(result.compacted)}")
