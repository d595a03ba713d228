"""`tally dashboard`: the Streamlit dashboard of a configuration's ledger on its own, as
`tally up` starts it (`tally.stack.dashboard_command`), until Ctrl-C or SIGTERM.

The command becomes Streamlit (exec), so signals reach the server itself and its exit status is
the command's. Exit 4 (`no ledger at PATH`) when the data directory holds no ledger: a typo
must not show an empty dashboard. With a dashboard login (`auth.oidc.dashboard`) it first
writes Streamlit's secrets file (`tally.dashboard_login`); exit 2 when a secret's variable is
not set.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from tally.cli.help import Command
from tally.cli.options import (
    Exit,
    config_option,
    data_dir_option,
    fail,
    load_or_exit,
    log_level_option,
    reader_directory,
    require_ledger,
)
from tally.language import _


@click.command(cls=Command)
@config_option
@data_dir_option
@click.option(
    "--host", default=None, help="Address to serve on (default: dashboard.host of the config)."
)
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Port to serve on (default: dashboard.port of the config).",
)
@log_level_option
def dashboard(
    config_path: str, data_dir: str | None, host: str | None, port: int | None, log_level: str
) -> None:
    """Serve the Streamlit dashboard for the config's ledger until Ctrl-C (health check at
    /_stcore/health)."""
    from tally.config import ConfigError
    from tally.dashboard_login import write_secrets
    from tally.stack import dashboard_command, ledger_env

    config = load_or_exit(config_path)
    if data_dir:
        config = config.model_copy(
            update={"ledger": config.ledger.model_copy(update={"data_dir": Path(data_dir)})}
        )
    require_ledger(reader_directory(config))  # with an object store: pulled once to check
    try:
        write_secrets(config)  # the login's secrets file, with a dashboard login configured
    except ConfigError as exc:
        fail(str(exc), Exit.USAGE)
    argv = dashboard_command(config, host, port, log_level)
    env = dict(os.environ, **ledger_env(config, Path(config_path).resolve()))
    address = host or config.dashboard.host
    click.echo(
        _("dashboard at http://{address}:{port}").format(
            address=address, port=port or config.dashboard.port
        ),
        err=True,
    )
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(argv[0], argv, env)
