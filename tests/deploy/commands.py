"""The `tally` command lines that deployment files run, checked against the real CLI.

Owns what every deployment test asks of a command line: that click's own parser, with the
real `tally` command tree, accepts it (the subcommand exists, every option exists and its
value has the right type and choice); which configuration file it reads (mapped from the path
it has inside a container or host to the file in `deploy/`), and that file passes `tally
config check`; which ports and environment variables (secrets) that process needs by its
configuration.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
from click.testing import CliRunner

from tally.cli import cli
from tally.config import TallyConfig, load_config
from tally.metrics_config import MetricsProcess

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"

# the parameters of `tally` commands that name a configuration file
CONFIG_PARAMS = ("config_path", "config_file")

# the health endpoints Tally serves (tally/health_http.py) and Streamlit's (tally dashboard)
HEALTH_PATHS = frozenset({"/healthz", "/readyz"})
DASHBOARD_HEALTH_PATH = "/_stcore/health"


@dataclass(frozen=True, slots=True)
class TallyCommand:
    """One command line after the `tally` program name, as click parsed it."""

    path: tuple[str, ...]  # ("scheduler", "run")
    params: Mapping[str, Any]

    @property
    def name(self) -> str:
        return " ".join(self.path)

    def config_file(self, mounts: Mapping[str, Path]) -> Path:
        """The file in this repository that the command's configuration path is, through
        `mounts` (path in the container or on the host → repository file)."""
        given = [self.params[p] for p in CONFIG_PARAMS if self.params.get(p) is not None]
        assert given, f"tally {self.name}: no configuration file given"
        (where,) = given
        assert where in mounts, f"tally {self.name}: {where} is not a mounted configuration"
        return mounts[where]


def parse_tally(args: Sequence[str]) -> TallyCommand:
    """Parse `args` (what follows `tally`) with the CLI's click parser; a wrong command, an
    unknown option or a bad value raises `click.ClickException` (or `click.exceptions.Exit`
    for `--help`, which a deployment never runs)."""
    command: click.Command = cli
    ctx = command.make_context("tally", list(args))
    path: list[str] = []
    while isinstance(command, click.Group):
        # what the group left for its subcommand, as `Group.invoke` reads it
        rest = [*ctx._protected_args, *ctx.args]
        assert rest, f"tally {' '.join(path)}: no subcommand"
        name, sub, rest = command.resolve_command(ctx, rest)
        assert name is not None and sub is not None
        path.append(name)
        ctx = sub.make_context(name, rest, parent=ctx)
        command = sub
    return TallyCommand(tuple(path), dict(ctx.params))


def config_check(path: Path) -> TallyConfig:
    """`tally config check PATH` must pass; returns the configuration it read."""
    result = CliRunner().invoke(cli, ["config", "check", str(path)])
    assert result.exit_code == 0, f"tally config check {path}: {result.output}"
    return load_config(path)


# the long-running commands that serve `/metrics`, `/healthz`, `/readyz`, by `metrics:` name
METRICS_PROCESS: Mapping[tuple[str, ...], MetricsProcess] = {
    ("worker",): "worker",
    ("scheduler", "run"): "scheduler",
    ("collect",): "collector",
    ("alerts", "run"): "alerts",
}
LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})


def metrics_port(config: TallyConfig, command: TallyCommand) -> int | None:
    """The port the process serves `/metrics`, `/healthz`, `/readyz` on, by its
    `--metrics-port` or else its config (None: it serves none)."""
    given = command.params.get("metrics_port")
    if given is not None:
        return int(given)
    process = METRICS_PROCESS.get(command.path)
    if process is None or not config.metrics.enabled:
        return None
    return config.metrics.port_of(process)


def serves_outside(config: TallyConfig, command: TallyCommand) -> bool:
    """Whether the process's metrics and health endpoints listen beyond the loopback, where a
    probe or Prometheus outside its container can reach them."""
    host = command.params.get("metrics_host") or config.metrics.host_of(
        METRICS_PROCESS[command.path]
    )
    return str(host) not in LOOPBACK


# the commands that read or write the sealed ledger, so reach its object store when it has one
STORE_USERS = frozenset({("worker",), ("dashboard",), ("admin", "apply")})


def secret_variables(config: TallyConfig, command: TallyCommand) -> frozenset[str]:
    """The environment variables the process reads secrets from (its config's `*_env`
    fields), each of which must be set where it runs."""
    names: set[str] = set()
    uses_kafka = command.path != ("dashboard",)
    broker = config.broker
    if uses_kafka and broker.mode == "external":
        if broker.sasl is not None:
            names.add(broker.sasl.password_env)
        if broker.tls is not None and broker.tls.key_password_env:
            names.add(broker.tls.key_password_env)
    if command.path == ("scheduler", "run"):
        tokens = config.scheduler.tokens
        if tokens.file is None and tokens.admin_env:
            names.add(tokens.admin_env)
        names.update(tokens.team_env.values())
    if config.ledger.segments_url is not None and command.path in STORE_USERS:
        store = config.ledger.object_store
        env_names = (store.access_key_id_env, store.secret_access_key_env, store.session_token_env)
        names.update(v for v in env_names if v)
    if command.path == ("alerts", "run"):
        for sink in config.alerts.sinks:
            names.update(v for v in (sink.url_env, sink.secret_env) if v)
            names.update(sink.headers_env.values())
    return frozenset(names)
