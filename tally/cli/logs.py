"""How every long-running command (`worker`, `scheduler run`, `collect`, `alerts run`, `up`)
logs: one format on stderr — a line of text, or with `--log-format json` ($TALLY_LOG_FORMAT)
one JSON object per line for a log pipeline (`JsonLineFormatter`) — one level vocabulary
(`--log-level` / $TALLY_LOG_LEVEL, the options in `tally.cli.options`), and its one translation
for Faust's worker (`faust_loglevel`).

Tally's own loggers (`tally.*`) log at the chosen level; every other logger (Faust, aiokafka,
mode) logs its warnings and errors only (errors only at `error`), everything at `debug`.
"""

from __future__ import annotations

import logging.config
from datetime import UTC, datetime
from typing import Any

import orjson

LOG_FORMAT = "%(asctime)s {component} %(levelname)s %(name)s: %(message)s"


class JsonLineFormatter(logging.Formatter):
    """One JSON object per record, on one line: `time` (UTC, ISO 8601 with milliseconds),
    `level`, `component`, `logger`, `message` (arguments applied), and `exception` /
    `stack` (the formatted traceback) when the record carries one. A message is always a
    string, so no record can make a line that is not JSON."""

    def __init__(self, component: str) -> None:
        super().__init__()
        self.component = component

    def format(self, record: logging.LogRecord) -> str:
        stamp = datetime.fromtimestamp(record.created, UTC)
        line: dict[str, str] = {
            "time": stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "component": self.component,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return orjson.dumps(line).decode()


def library_level(level: str) -> str:
    """The level libraries log at when Tally logs at `level`: warnings and errors (errors only
    at `error`), everything at `debug`."""
    name = level.upper()
    return name if name in ("DEBUG", "ERROR") else "WARNING"


FAUST_LEVELS = {"DEBUG": "debug", "WARNING": "warn", "ERROR": "error"}


def faust_loglevel(level: str) -> str:
    """`level` in the words of Faust's worker (crit|error|warn|info|debug), as `library_level`
    has it: Faust is a library here."""
    return FAUST_LEVELS[library_level(level)]


def logging_config(component: str, level: str, log_format: str = "text") -> dict[str, Any]:
    """The `logging.config.dictConfig` of a long-running command named `component`; Faust's
    worker is handed the same one, so its records look like everyone else's. One handler, on
    the root logger; `tally` records reach it whatever the root's own level (a logger's level
    filters only the records it is asked to log). `log_format` is `text` or `json`."""
    formatter: dict[str, Any]
    if log_format.lower() == "json":
        formatter = {"()": JsonLineFormatter, "component": component}
    else:
        formatter = {"format": LOG_FORMAT.format(component=component)}
    handler = {"class": "logging.StreamHandler", "stream": "ext://sys.stderr", "formatter": "line"}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"line": formatter},
        "handlers": {"stderr": handler},
        "loggers": {"tally": {"level": level.upper(), "propagate": True}},
        "root": {"level": library_level(level), "handlers": ["stderr"]},
    }


def configure_logging(component: str, level: str, log_format: str = "text") -> dict[str, Any]:
    """Apply `logging_config(component, level, log_format)`; return it (for Faust's worker)."""
    config = logging_config(component, level, log_format)
    logging.config.dictConfig(config)
    return config
