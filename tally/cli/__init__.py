"""The `tally` command line: one group, a module per command family.

Exit codes (stable; scripts may rely on them):
    0  success
    1  a check failed (e.g. `tally ledger verify` found problems)
    2  bad usage or an invalid configuration file
    3  the broker could not be reached
    4  the ledger could not be read or written (or --data-dir holds no ledger)
   70  an internal error (a bug): one line on stderr says where the traceback is
  130  interrupted (Ctrl-C)
  141  stdout was closed before the output was all written (`tally report cost | head -1`):
       the rest is dropped quietly, no traceback, as a Unix tool killed by SIGPIPE (128 + 13);
       0 when the reader left mid-way through the last write (Python does not report that)

No command imports Faust (`streams.worker`) unless it runs the worker: importing Faust parses
the process's argv for its own options, and a job command's `-L` is not Faust's.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
import time
import traceback
from typing import Any, NoReturn

import click

from tally.cli import (
    admin,
    alerts,
    audit,
    collect,
    config,
    export,
    inventory,
    job,
    ledger,
    report,
    request,
    stack,
    whatif,
)
from tally.cli import dashboard as dashboard_cli
from tally.cli import scheduler as scheduler_cli
from tally.cli.help import Group
from tally.cli.options import Exit
from tally.language import _

log = logging.getLogger("tally.cli")

DEBUG_ENV = "TALLY_DEBUG"


class _Run:
    """What `main` learns from the group's options while the command runs."""

    debug = False


class _OutputClosed(Exception):
    """Stdout's reader went away (a broken pipe): raised past click, which would exit 1."""


class _Group(Group):
    """The `tally` group: a write to a closed stdout, while parsing (`--help`) or running a
    command, becomes `_OutputClosed`, which `main` turns into exit 141."""

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        try:
            return super().make_context(*args, **kwargs)
        except BrokenPipeError as exc:
            raise _OutputClosed from exc

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError as exc:
            raise _OutputClosed from exc


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="tally")
@click.option(
    "--debug",
    is_flag=True,
    envvar=DEBUG_ENV,
    help="On an internal error, print the traceback to stderr (also $TALLY_DEBUG=1).",
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
cli.add_command(audit.audit)
cli.add_command(alerts.alerts)
cli.add_command(scheduler_cli.scheduler)
cli.add_command(job.job)
cli.add_command(job.queue)
cli.add_command(inventory.inventory)
cli.add_command(request.request)
cli.add_command(whatif.whatif)


def internal_error(exc: BaseException, debug: bool) -> NoReturn:
    """Exit `Exit.INTERNAL` with one line on stderr naming the exception and where its
    traceback is: above (--debug), else a file of its own in the temporary directory."""
    log.debug("internal error", exc_info=exc)
    text = "".join(traceback.format_exception(exc))
    if debug:
        sys.stderr.write(text)
        where = _("the lines above")
    else:
        try:
            fd, name = tempfile.mkstemp(prefix="tally-internal-error-", suffix=".log")
            with os.fdopen(fd, "w") as file:
                file.write(text)
            where = name
        except OSError:
            where = _("stderr with --debug")
    message = " ".join(str(exc).split())
    click.echo(
        _("tally: internal error: {kind}: {message} (traceback in {where})").format(
            kind=type(exc).__name__, message=message, where=where
        ),
        err=True,
    )
    sys.exit(int(Exit.INTERNAL))


def output_closed() -> int:
    """What a closed stdout ends in: stdout pointed at /dev/null, so that nothing flushed later
    (at interpreter exit) fails again, and `Exit.OUTPUT_CLOSED`."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    return int(Exit.OUTPUT_CLOSED)


def run(started: float) -> int | str | None:
    """Run the command line; its exit status (`sys.exit` takes it as it is)."""
    _Run.debug = False
    try:
        code = cli.main(standalone_mode=False)
    except SystemExit as exc:  # a command's `sys.exit(code)` or `fail(...)`
        return exc.code
    except (_OutputClosed, BrokenPipeError):
        return output_closed()
    except click.exceptions.Abort:
        click.echo(_("interrupted"), err=True)
        return int(Exit.INTERRUPTED)
    except click.ClickException as exc:
        exc.show()
        return int(Exit.USAGE)
    except KeyboardInterrupt:
        click.echo(
            _("interrupted after {seconds}s").format(seconds=f"{time.monotonic() - started:.0f}"),
            err=True,
        )
        return int(Exit.INTERRUPTED)
    except Exception as exc:
        internal_error(exc, _Run.debug or os.environ.get(DEBUG_ENV, "") not in ("", "0"))
    # `ctx.exit(code)` returns its code without standalone mode
    return code if isinstance(code, int) else None


def main() -> None:
    code = run(time.monotonic())
    try:
        sys.stdout.flush()  # here, not at interpreter exit, where a closed pipe cannot be caught
    except BrokenPipeError:
        code = output_closed()
    sys.exit(code)
