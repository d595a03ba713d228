"""What every `tally` command shares: exit codes, failing with a message, config loading,
and the common options."""

from __future__ import annotations

import sys
from enum import IntEnum
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import click

from ledger.store.layout import has_ledger
from tally.config import ConfigError, TallyConfig, load_config
from tally.language import _, translate
from tally.output import OutputFormat

if TYPE_CHECKING:
    from tally.kafka_clients import KafkaClients

DEFAULT_CONFIG = "deploy/examples/tally.yaml"


class Exit(IntEnum):
    OK = 0
    CHECK_FAILED = 1
    USAGE = 2
    BROKER = 3
    LEDGER = 4
    INTERNAL = 70
    INTERRUPTED = 130
    OUTPUT_CLOSED = 141  # stdout closed early (a broken pipe), as SIGPIPE would end a tool


def said(exc: BaseException) -> str:
    """An error's message in the CLI's language: a broker error's template (`BrokerError.say`)
    through the catalog, any other error's message as it is."""
    say = getattr(exc, "say", None)
    return str(say(translate)) if callable(say) else str(exc)


def fail(message: str, code: Exit) -> NoReturn:
    click.secho(_("error: {message}").format(message=message), fg="red", err=True)
    sys.exit(int(code))


def load_or_exit(path: str) -> TallyConfig:
    try:
        return load_config(path)
    except ConfigError as exc:
        fail(str(exc), Exit.USAGE)


def resolve_data_dir(
    config_path: str | None, data_dir: str | None, *, replica: bool = True
) -> Path:
    """`--data-dir`, else the config's `ledger.data_dir`; with `ledger.segments_url` set and
    `replica` (a reader), the read cache under it brought up to date from the object store
    (`reader_directory`)."""
    if data_dir:
        return Path(data_dir)
    config = load_or_exit(config_path or DEFAULT_CONFIG)
    return reader_directory(config) if replica else config.ledger.data_dir


def reader_directory(config: TallyConfig) -> Path:
    """Where a reader of `config`'s ledger reads it: `ledger.data_dir`, or with
    `ledger.segments_url` set its read cache, pulled from the store (exit `Exit.LEDGER` when the
    store cannot be read, `Exit.USAGE` when a credential variable is not set)."""
    from ledger.errors import LedgerError
    from tally.segments_config import reader_dir

    ledger = config.ledger
    try:
        return reader_dir(ledger.data_dir, ledger.segments_url, ledger.object_store)
    except ConfigError as exc:
        fail(str(exc), Exit.USAGE)
    except (OSError, LedgerError) as exc:
        fail(
            _("the sealed ledger at {url} cannot be read: {problem}").format(
                url=ledger.segments_url, problem=exc
            ),
            Exit.LEDGER,
        )


def require_ledger(directory: Path) -> Path:
    """`directory`, if it holds a ledger; else exit `Exit.LEDGER` (a typo in --data-dir must not
    read as an empty ledger, nor be created as a new one)."""
    if not has_ledger(directory):
        fail(_("no ledger at {directory}").format(directory=directory), Exit.LEDGER)
    return directory


def resolve_ledger_dir(
    config_path: str | None, data_dir: str | None, *, replica: bool = True
) -> Path:
    """The data directory (as `resolve_data_dir`) of a command that reads the ledger: it must
    hold one."""
    return require_ledger(resolve_data_dir(config_path, data_dir, replica=replica))


config_option = click.option(
    "--config",
    "-c",
    "config_path",
    envvar="TALLY_CONFIG",
    default=DEFAULT_CONFIG,
    show_default=True,
    type=click.Path(dir_okay=False),
    help="Tally configuration file.",
)
bootstrap_option = click.option(
    "--bootstrap",
    envvar="TALLY_BOOTSTRAP",
    default=None,
    metavar="HOST:PORT[,…]",
    help="Kafka bootstrap servers (default: from the config; set by `tally up`).",
)
data_dir_option = click.option(
    "--data-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Ledger data directory (default: the config's ledger.data_dir).",
)
output_option = click.option(
    "--output",
    "-o",
    type=click.Choice([f.value for f in OutputFormat]),
    default="table",
    show_default=True,
    help="Output format.",
)

LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_LEVEL_ENV = "TALLY_LOG_LEVEL"
log_level_option = click.option(
    "--log-level",
    type=click.Choice(LOG_LEVELS, case_sensitive=False),
    envvar=LOG_LEVEL_ENV,
    default="info",
    show_default=True,
    show_envvar=True,
    help="Log Tally's messages at this level and above to stderr; libraries (Faust, aiokafka) "
    "log warnings and errors only, everything at debug.",
)

LOG_FORMATS = ("text", "json")
LOG_FORMAT_ENV = "TALLY_LOG_FORMAT"
log_format_option = click.option(
    "--log-format",
    type=click.Choice(LOG_FORMATS, case_sensitive=False),
    envvar=LOG_FORMAT_ENV,
    default="text",
    show_default=True,
    show_envvar=True,
    help="How each log record is written to stderr: a line of text, or one JSON object per "
    "line (time, level, component, logger, message, exception) for a log pipeline.",
)


def kafka_or_exit(config: TallyConfig) -> KafkaClients:
    """The Kafka client settings of `config` (`tally.kafka_clients`); a secret not set or a TLS
    file that cannot be used ends the command with `Exit.USAGE`, naming the field."""
    from tally.kafka_clients import kafka_clients

    try:
        return kafka_clients(config.broker)
    except ConfigError as exc:
        fail(str(exc), Exit.USAGE)


def ensure_topics_or_exit(
    config: TallyConfig, servers: tuple[str, ...], kafka: KafkaClients
) -> None:
    """Create the config's topics that do not exist (`TopicsConfig.specs`) and warn about every
    way an existing one differs from its spec; a broker that cannot be used ends the command
    with `Exit.BROKER`."""
    import asyncio

    from streams.kafka import BrokerError
    from streams.topics import ensure_topic_specs

    try:
        report = asyncio.run(ensure_topic_specs(servers[0], config.topics.specs(), kafka.security))
    except BrokerError as exc:
        fail(said(exc), Exit.BROKER)
    warn_topic_drift(report.drift)


def warn_topic_drift(drift: tuple[str, ...]) -> None:
    for line in drift:
        click.secho(
            _("warning: {line} (Tally does not change an existing topic)").format(line=line),
            fg="yellow",
            err=True,
        )
