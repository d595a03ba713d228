"""The `tally` command line: one group, a module per command family.

Exit codes (stable; scripts may rely on them):
    0  success
    1  a check failed (e.g. `tally ledger verify` found problems)
    2  bad usage or an invalid configuration file
    3  the broker could not be reached
    4  the ledger could not be read or written (or --data-dir holds no ledger)
   70  an internal error (a bug): one line on stderr says where the traceback is
  130  interrupted (Ctrl-C)

No command imports Faust (`streams.worker`) unless it runs the worker: importing Faust parses
the process's argv for its own options, and a job command's `-L` is not Faust's.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import time
import traceback
from typing import NoReturn

import click

from tally.cli import (
    admin,
    alerts,
    collect,
    config,
    export,
    inventory,
    job,
    ledger,
    report,
    stack,
)
from tally.cli import dashboard as dashboard_cli
from tally.cli import scheduler as scheduler_cli
from tally.cli.options import Exit

log = logging.getLogger("tally.cli")

DEBUG_ENV = "TALLY_DEBUG"


class _Run:
    """What `main` learns from the group's options while the command runs."""

    debug = False


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="tally")
@click.option(
    "--debug",
    is_flag=True,
    envvar=DEBUG_ENV,
    help=f"On an internal error, print the traceback to stderr (also ${DEBUG_ENV}=1).",
)
def cli(debug: bool) -> None:
    """Tally: an event-sourced GPU accounting ledger, its collectors, worker and dashboards."""
    _Run.debug = debug


cli.add_command(stack.up)
cli.add_command(stack.worker)
cli.add_command(dashboard_cli.dashboard)
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
cli.add_command(inventory.inventory)


def internal_error(exc: BaseException, debug: bool) -> NoReturn:
    """Exit `Exit.INTERNAL` with one line on stderr naming the exception and where its
    traceback is: above (--debug), else a file of its own in the temporary directory."""
    log.debug("internal error", exc_info=exc)
    text = "".join(traceback.format_exception(exc))
    if debug:
        sys.stderr.write(text)
        where = "the lines above"
    else:
        try:
            fd, name = tempfile.mkstemp(prefix="tally-internal-error-", suffix=".log")
            with os.fdopen(fd, "w") as file:
                file.write(text)
            where = name
        except OSError:
            where = "stderr with --debug"
    message = " ".join(str(exc).split())
    click.echo(
        f"tally: internal error: {type(exc).__name__}: {message} (traceback in {where})", err=True
    )
    sys.exit(int(Exit.INTERNAL))


def main() -> None:
    started = time.monotonic()
    _Run.debug = False
    try:
        code = cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("interrupted", err=True)
        sys.exit(int(Exit.INTERRUPTED))
    except click.ClickException as exc:
        exc.show()
        sys.exit(int(Exit.USAGE))
    except KeyboardInterrupt:
        click.echo(f"interrupted after {time.monotonic() - started:.0f}s", err=True)
        sys.exit(int(Exit.INTERRUPTED))
    except Exception as exc:
        internal_error(exc, _Run.debug or os.environ.get(DEBUG_ENV, "") not in ("", "0"))
    if isinstance(code, int) and code:  # `ctx.exit(code)` returns it without standalone mode
        sys.exit(code)
