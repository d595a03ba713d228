"""`tally inventory list`: the GPUs the collectors report, as the ledger's last seal recorded
them (`segments/inventory.json`, `ledger.store.side_files`; with the sealed ledger on an object
store, that file alone, `tally.cli.side_state`), with each GPU's status now (`live`
or `stale` after `inventory.stale_after_intervals` silent sampling intervals), its health and
cordon, and when it was first and last seen (in a table on the ledger's clock, `ledger.timezone`;
in JSON and CSV in UTC); `tally inventory cordon|uncordon NODE_OR_GPU --reason …`: the admin
events that keep new placements off a node or GPU, and let them back."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, tzinfo
from pathlib import Path
from typing import Any

import click

from ledger.admin import (
    GpuCordoned,
    GpuUncordoned,
    admin_event_from_dict,
    admin_event_to_dict,
)
from ledger.errors import EventError
from ledger.inventory import InventoryGpu, status_of
from ledger.store.identity import IDENTITY_NAME
from ledger.store.side_files import ADMIN_LOG_PATH, INVENTORY_PATH
from ledger.topology import GpuTopology, topology_to_dict
from tally.cli.admin import (
    actor_option,
    default_actor,
    dry_run_option,
    echo_events,
    now_us,
    send_admin_events,
)
from tally.cli.caller import admin_token_option, as_caller
from tally.cli.help import Group
from tally.cli.options import (
    Exit,
    bootstrap_option,
    config_option,
    data_dir_option,
    fail,
    load_or_exit,
    output_option,
)
from tally.cli.side_state import read_side
from tally.inventory_config import InventoryConfig
from tally.language import _
from tally.output import OutputFormat, render, shown_time

HEADERS = [
    "node",
    "index",
    "uuid",
    "pool",
    "model",
    "memory_mib",
    "mig",
    "labels",
    "topology",
    "driver",
    "cuda",
    "health",
    "health_reason",
    "faults",
    "cordoned",
    "status",
    "first_seen",
    "last_seen",
]


def _topology(topology: GpuTopology, structured: bool) -> Any:
    """Where the GPU sits: an object in JSON, `nvlink_domain=…,numa_node=…` as text (None: not
    known)."""
    known = topology_to_dict(topology)
    if structured:
        return known
    return ",".join(f"{k}={v}" for k, v in known.items()) or None


def inventory_rows(
    gpus: list[InventoryGpu],
    now_us: int,
    stale_after_intervals: int,
    fmt: OutputFormat,
    zone: tzinfo = UTC,
) -> list[list[Any]]:
    """One row per GPU; JSON keeps labels as an object and MIG profiles as a list; first and
    last seen on `zone`'s clock in a table, in UTC otherwise (`tally.output.shown_time`)."""
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
                _topology(g.topology, structured),
                g.driver_version,
                g.cuda_version,
                g.health.value,
                g.health_reason,
                g.faults,
                f"{g.cordoned_by}: {g.cordon_reason}" if g.cordoned else None,
                status.value,
                shown_time(g.first_seen_us, fmt, zone),
                shown_time(g.last_seen_us, fmt, zone),
            ]
        )
    return rows


@click.group(cls=Group)
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
    side = read_side(config_path, data_dir, [INVENTORY_PATH, IDENTITY_NAME])
    gpus = [g for g in side.inventory() if pool is None or g.pool == pool]
    zone = side.zone()
    fmt = OutputFormat(output)
    if not gpus and fmt is OutputFormat.TABLE:
        click.echo("no GPUs reported" + (f" in pool {pool}" if pool else ""))
        return
    now = time.time_ns() // 1000
    rows = inventory_rows(gpus, now, stale_after, fmt, zone)
    click.echo(render(HEADERS, rows, fmt))


# ---------------------------------------------------------------------------- cordons


def _cordon(
    target: str,
    config_path: str,
    bootstrap: str | None,
    data_dir: str | None,
    reason: str,
    actor: str | None,
    dry_run: bool,
    on: bool,
    token: str | None = None,
) -> None:
    config = load_or_exit(config_path)
    side = read_side(config_path, data_dir, [INVENTORY_PATH, ADMIN_LOG_PATH])  # exit 4: none
    gpus = [g for g in side.inventory() if target in (g.uuid, g.node)]
    if not gpus:
        fail(
            _("no GPU or node {target!r} in the inventory (as of the last seal)").format(
                target=target
            ),
            Exit.USAGE,
        )
    standing = target in side.admin_view().cordons
    if on and standing:
        click.echo(f"{target} is already cordoned")
        return
    if not on and not standing and not any(g.cordoned for g in gpus):
        click.echo(f"{target} is not cordoned")
        return
    who = actor or default_actor()
    kind = GpuCordoned if on else GpuUncordoned
    try:
        event = admin_event_from_dict(
            kind.KIND, admin_event_to_dict(kind(target, who, reason, now_us()))
        )
    except EventError as exc:
        fail(str(exc), Exit.USAGE)
    (event,) = as_caller(config, token, [event])
    echo_events([event], OutputFormat.TABLE)
    if dry_run:
        click.echo(_("dry run: not sent"), err=True)
        return
    (sent,) = send_admin_events(config, bootstrap, [event])
    click.echo(_("sent {sent} to {admin}").format(sent=sent, admin=config.topics.admin), err=True)


def cordon_options(command: Callable[..., None]) -> Callable[..., None]:
    for decorate in (
        admin_token_option,
        dry_run_option,
        actor_option,
        click.option("--reason", required=True, help="Why (recorded with the event)."),
        data_dir_option,
        bootstrap_option,
        config_option,
        click.argument("target", metavar="NODE_OR_GPU"),
    ):
        command = decorate(command)
    return command


@inventory.command()
@cordon_options
def cordon(
    target: str,
    config_path: str,
    bootstrap: str | None,
    data_dir: str | None,
    reason: str,
    actor: str | None,
    dry_run: bool,
    token: str | None,
) -> None:
    """Cordon NODE_OR_GPU (a node name or a GPU UUID): the scheduler places nothing new on it
    (a node: on each of its GPUs, also those it reports later); running jobs keep running.

    An admin event with the actor and reason, applied by the worker. Exit 2 for a target the
    inventory does not know, 3 when the broker does not take it, 4 without a ledger."""
    _cordon(target, config_path, bootstrap, data_dir, reason, actor, dry_run, True, token)


@inventory.command()
@cordon_options
def uncordon(
    target: str,
    config_path: str,
    bootstrap: str | None,
    data_dir: str | None,
    reason: str,
    actor: str | None,
    dry_run: bool,
    token: str | None,
) -> None:
    """Uncordon NODE_OR_GPU: it takes new placements again (unless it is unhealthy). Exit
    codes as for `cordon`."""
    _cordon(target, config_path, bootstrap, data_dir, reason, actor, dry_run, False, token)
