"""How every long-running command (`worker`, `scheduler run`, `collect`, `alerts run`, `up`)
logs: one format on stderr, one level vocabulary (`--log-level` / $TALLY_LOG_LEVEL, the option
in `tally.cli.options`), and its one translation for Faust's worker (`faust_loglevel`).

Tally's own loggers (`tally.*`) log at the chosen level; every other logger (Faust, aiokafka,
mode) logs its warnings and errors only (errors only at `error`), everything at `debug`.
"""

from __future__ import annotations

import logging.config
from typing import Any

LOG_FORMAT = "%(asctime)s {component} %(levelname)s %(name)s: %(message)s"


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


def logging_config(component: str, level: str) -> dict[str, Any]:
    """The `logging.config.dictConfig` of a long-running command named `component`; Faust's
    worker is handed the same one, so its records look like everyone else's. One handler, on
    the root logger; `tally` records reach it whatever the root's own level (a logger's level
    filters only the records it is asked to log)."""
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


def configure_logging(component: str, level: str) -> dict[str, Any]:
    """Apply `logging_config(component, level)`; return it (for Faust's worker)."""
    config = logging_config(component, level)
    logging.config.dictConfig(config)
    return config
