"""`tally inventory list`: the GPUs the collectors report, as the ledger's last seal recorded
them (`segments/inventory.json`, `ledger.store.side_files`), with each GPU's status now (`live`
or `stale` after `inventory.stale_after_intervals` silent sampling intervals)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from ledger.errors import LedgerError
from ledger.inventory import InventoryGpu, status_of
from ledger.store.layout import SEGMENTS_DIR
from ledger.store.side_files import load_inventory
from tally.cli.options import (
    Exit,
    config_option,
    data_dir_option,
    fail,
    load_or_exit,
    output_option,
    resolve_ledger_dir,
)
from tally.inventory_config import InventoryConfig
from tally.output import OutputFormat, render

HEADERS = [
    "node",
    "index",
    "uuid",
    "pool",
    "model",
    "memory_mib",
    "mig",
    "labels",
    "driver",
    "cuda",
    "health",
    "status",
    "first_seen",
    "last_seen",
]


def _utc(time_us: int) -> str:
    return datetime.fromtimestamp(time_us / 1e6, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def inventory_rows(
    gpus: list[InventoryGpu], now_us: int, stale_after_intervals: int, fmt: OutputFormat
) -> list[list[Any]]:
    """One row per GPU; JSON keeps labels as an object and MIG profiles as a list."""
    rows: list[list[Any]] = []
    for g in gpus:
        profiles = [m.profile for m in g.mig]
        status = status_of(g.last_seen_us, g.interval_us, now_us, stale_after_intervals)
        structured = fmt is OutputFormat.JSON
        rows.append(
            [
                g.node,
                g.index,
                g.uuid,
                g.pool,
                g.model,
                g.memory_total_bytes >> 20,
                profiles if structured else ",".join(profiles) or None,
                dict(g.labels) if structured else ",".join(f"{k}={v}" for k, v in g.labels) or None,
                g.driver_version,
                g.cuda_version,
                g.health.value,
                status.value,
                _utc(g.first_seen_us),
                _utc(g.last_seen_us),
            ]
        )
    return rows


@click.group()
def inventory() -> None:
    """The GPU inventory the collectors report."""


@inventory.command("list")
@config_option
@data_dir_option
@output_option
@click.option("--pool", default=None, help="Only the GPUs of this pool.")
def list_gpus(config_path: str, data_dir: str | None, output: str, pool: str | None) -> None:
    """Every GPU reported, by node and index, as of the ledger's last seal.

    `status` is `stale` for a GPU no report has named for more than
    `inventory.stale_after_intervals` sampling intervals (the scheduler places nothing new on
    it), else `live`. Exit 4 when there is no ledger.
    """
    stale_after = InventoryConfig().stale_after_intervals
    if Path(config_path).is_file() or data_dir is None:
        stale_after = load_or_exit(config_path).inventory.stale_after_intervals
    directory = resolve_ledger_dir(config_path, data_dir)
    try:
        gpus = load_inventory(directory / SEGMENTS_DIR)
    except LedgerError as exc:
        fail(str(exc), Exit.LEDGER)
    gpus = [g for g in gpus if pool is None or g.pool == pool]
    fmt = OutputFormat(output)
    if not gpus and fmt is OutputFormat.TABLE:
        click.echo("no GPUs reported" + (f" in pool {pool}" if pool else ""))
        return
    now = time.time_ns() // 1000
    rows = inventory_rows(gpus, now, stale_after, fmt)
    click.echo(render(HEADERS, rows, fmt))
