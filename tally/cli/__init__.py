"""The `tally` command line: one group, a module per command family.

Exit codes (stable; scripts may rely on them):
    0  success
    1  a check failed (e.g. `tally ledger verify` found problems)
    2  bad usage or an invalid configuration file
    3  the broker could not be reached
    4  the ledger could not be read or written
  130  interrupted (Ctrl-C)
"""

from __future__ import annotations

import sys
import time

import click

from tally.cli import admin, alerts, collect, config, export, job, ledger, report, stack
from tally.cli import scheduler as scheduler_cli
from tally.cli.options import Exit


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="tally")
def cli() -> None:
    """Tally: an event-sourced GPU accounting ledger, its collectors, worker and dashboards."""


cli.add_command(stack.up)
cli.add_command(stack.worker)
cli.add_command(collect.collect)
cli.add_command(ledger.ledger)
cli.add_command(report.report)
cli.add_command(config.config)
cli.add_command(export.export)
cli.add_command(admin.admin)
cli.add_command(alerts.alerts)
cli.add_command(scheduler_cli.scheduler)
cli.add_command(job.job)
cli.add_command(job.queue)


def main() -> None:
    started = time.monotonic()
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("interrupted", err=True)
        sys.exit(int(Exit.INTERRUPTED))
    except click.ClickException as exc:
        exc.show()
        sys.exit(int(Exit.USAGE))
    except KeyboardInterrupt:
        click.echo(f"interrupted after {time.monotonic() - started:.0f}s", err=True)
        sys.exit(int(Exit.INTERRUPTED))
