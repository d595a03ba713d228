"""One log-level vocabulary for every long-running command: the same `--log-level` (choices,
default, $TALLY_LOG_LEVEL, case-insensitive), the same format (text, or JSON lines with
`--log-format json`), one translation for Faust, and `tally up` passing its level and format on
to every process it starts."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from tally.cli import cli
from tally.cli.logs import (
    LOG_FORMAT,
    configure_logging,
    faust_loglevel,
    library_level,
    logging_config,
)
from tally.config import parse_config
from tally.stack import Stack
from tests.builders import a_config_dict
from tests.conftest import write_config

LONG_RUNNING = {
    "worker": ["worker"],
    "scheduler run": ["scheduler", "run"],
    "collect": ["collect"],
    "alerts run": ["alerts", "run"],
    "up": ["up"],
    "dashboard": ["dashboard"],
}


def _command(path: list[str]) -> click.Command:
    command: click.Command = cli
    for name in path:
        assert isinstance(command, click.Group)
        command = command.commands[name]
    return command


def _help(path: list[str]) -> str:
    result = CliRunner().invoke(cli, [*path, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())


@pytest.mark.parametrize("command", list(LONG_RUNNING))
def test_every_long_running_command_lists_the_same_levels(command):
    text = _help(LONG_RUNNING[command])
    assert "--log-level [debug|info|warning|error]" in text
    assert "[env var: TALLY_LOG_LEVEL; default: info]" in text


def test_the_long_running_commands_share_one_option():
    options = [
        next(p for p in _command(path).params if p.name == "log_level")
        for path in LONG_RUNNING.values()
    ]
    described = {
        (tuple(o.opts), tuple(o.type.choices), o.default, o.envvar, o.type.case_sensitive)
        for o in options
    }
    assert described == {
        (("--log-level",), ("debug", "info", "warning", "error"), "info", "TALLY_LOG_LEVEL", False)
    }


def _no_level_option(command: click.Command) -> bool:
    return not any(p.name == "log_level" for p in command.params)


def test_no_other_command_has_a_log_level():
    def walk(command: click.Command, path: list[str]) -> Iterator[tuple[list[str], click.Command]]:
        if isinstance(command, click.Group):
            for name, sub in command.commands.items():
                yield from walk(sub, [*path, name])
        else:
            yield path, command

    others = [p for p, c in walk(cli, []) if p not in LONG_RUNNING.values()]
    assert others and all(_no_level_option(_command(p)) for p in others)


@pytest.mark.parametrize("where", ["option", "env"])
@pytest.mark.parametrize("command", list(LONG_RUNNING))
def test_an_invalid_level_is_a_usage_error(command, where):
    args = [*LONG_RUNNING[command], "--config", "/nonexistent/tally.yaml"]
    if where == "option":
        result = CliRunner().invoke(cli, [*args, "--log-level", "loud"])
    else:
        result = CliRunner().invoke(cli, args, env={"TALLY_LOG_LEVEL": "loud"})
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--log-level'" in result.output
    assert "'loud' is not one of 'debug', 'info', 'warning', 'error'" in result.output


@pytest.mark.parametrize(
    ("given", "tally_level", "libraries"),
    [
        pytest.param("DEBUG", logging.DEBUG, logging.DEBUG, id="DEBUG"),
        pytest.param("Info", logging.INFO, logging.WARNING, id="Info"),
        pytest.param("warning", logging.WARNING, logging.WARNING, id="warning"),
        pytest.param("ERROR", logging.ERROR, logging.ERROR, id="ERROR"),
    ],
)
def test_a_level_in_any_case_sets_tally_and_the_libraries(tmp_path, given, tally_level, libraries):
    config = write_config(tmp_path / "tally.yaml", a_config_dict())
    result = CliRunner().invoke(
        cli, ["collect", "--source", "sim", "--once", "--config", str(config), "--log-level", given]
    )
    assert result.exit_code == 0, result.output
    assert logging.getLogger("tally").getEffectiveLevel() == tally_level
    assert logging.getLogger("tally.collector.producer").getEffectiveLevel() == tally_level
    assert logging.getLogger("aiokafka").getEffectiveLevel() == libraries


@pytest.mark.parametrize(
    ("level", "library", "faust"),
    [
        pytest.param("debug", "DEBUG", "debug", id="debug"),
        pytest.param("info", "WARNING", "warn", id="info"),
        pytest.param("warning", "WARNING", "warn", id="warning"),
        pytest.param("error", "ERROR", "error", id="error"),
    ],
)
def test_the_libraries_and_faust_get_one_translation(level, library, faust):
    assert library_level(level) == library
    assert faust_loglevel(level) == faust
    assert faust in ("crit", "error", "warn", "info", "debug")  # what faust.Worker takes
    config = logging_config("worker", level)
    assert config["root"]["level"] == library
    assert config["loggers"]["tally"]["level"] == level.upper()


@pytest.mark.parametrize("component", ["worker", "scheduler", "collector", "alerts", "up"])
def test_every_component_logs_in_one_format(component):
    config = logging_config(component, "info")
    assert config["formatters"]["line"]["format"] == LOG_FORMAT.format(component=component)
    record = logging.LogRecord("tally.x", logging.INFO, __file__, 1, "hello %s", ("you",), None)
    line = logging.Formatter(config["formatters"]["line"]["format"]).format(record)
    assert line.endswith(f" {component} INFO tally.x: hello you")
    (handler,) = config["handlers"].values()  # one, on the root: tally records propagate to it
    assert (handler["stream"], handler["formatter"]) == ("ext://sys.stderr", "line")
    assert config["root"]["handlers"] == list(config["handlers"])
    assert config["loggers"]["tally"]["propagate"] is True


JSON_LOGGING = {k: v for k, v in LONG_RUNNING.items() if k != "dashboard"}  # Streamlit's own


@pytest.mark.parametrize("command", list(JSON_LOGGING))
def test_every_long_running_command_offers_json_lines(command):
    text = _help(JSON_LOGGING[command])
    assert "--log-format [text|json]" in text
    assert "[env var: TALLY_LOG_FORMAT; default: text]" in text


@pytest.mark.parametrize("where", ["option", "env"])
def test_an_unknown_log_format_is_a_usage_error(where):
    args = ["worker", "--config", "/nonexistent/tally.yaml"]
    if where == "option":
        result = CliRunner().invoke(cli, [*args, "--log-format", "xml"])
    else:
        result = CliRunner().invoke(cli, args, env={"TALLY_LOG_FORMAT": "xml"})
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--log-format'" in result.output


def _json_lines(capsys: pytest.CaptureFixture[str]) -> list[dict[str, str]]:
    return [json.loads(line) for line in capsys.readouterr().err.splitlines()]


def test_json_lines_carry_the_record_and_its_traceback(capsys):
    configure_logging("worker", "info", "json")
    logger = logging.getLogger("tally.worker.test")
    logger.info("batch of %d samples from %s", 3, 'node "a"\nb')
    try:
        raise ValueError("bad")
    except ValueError:
        logger.exception("commit failed")
    logging.getLogger("aiokafka").info("not shown at info")
    first, second = _json_lines(capsys)
    assert set(first) == {"time", "level", "component", "logger", "message"}
    assert first["message"] == 'batch of 3 samples from node "a"\nb'
    assert (first["level"], first["component"], first["logger"]) == (
        "INFO",
        "worker",
        "tally.worker.test",
    )
    assert first["time"].endswith("Z") and len(first["time"]) == len("2026-12-01T19:20:43.123Z")
    assert second["level"] == "ERROR"
    assert second["exception"].startswith("Traceback") and "ValueError: bad" in second["exception"]


def test_a_message_that_is_not_a_string_still_makes_a_json_line(capsys):
    configure_logging("collector", "debug", "json")
    logging.getLogger("tally.collector").debug({"gpu": b"\xff", "n": 1})
    (line,) = _json_lines(capsys)
    assert line["message"] == str({"gpu": b"\xff", "n": 1})


def test_faust_applying_the_same_config_again_keeps_json_lines(capsys):
    import logging.config

    config = configure_logging("worker", "info", "json")
    logging.config.dictConfig(config)  # what Faust's worker does with the config it is handed
    logging.getLogger("tally.worker").warning("rebalanced")
    (line,) = _json_lines(capsys)
    assert (line["component"], line["message"]) == ("worker", "rebalanced")


# --------------------------------------------------------------------- tally up passes it on


def _stack(tmp_path: Path, log_level: str, **sections: object) -> Stack:
    data = a_config_dict(ledger={"data_dir": str(tmp_path / "ledger")}, **sections)
    path = write_config(tmp_path / "tally.yaml", data)
    return Stack(parse_config(data, str(path)), path, dashboard=True, log_level=log_level)


def test_up_passes_its_level_to_every_process(tmp_path):
    alerts = {"sinks": [{"name": "ops", "kind": "slack", "url": "http://127.0.0.1:9/hook"}]}
    stack = _stack(tmp_path, "debug", alerts=alerts, scheduler={"enabled": True})
    children = {child.name: child.argv for child in stack._children()}
    assert set(children) == {"worker", "collector", "scheduler", "alerts", "dashboard"}
    for name, argv in children.items():
        flag = "--logger.level" if name == "dashboard" else "--log-level"
        assert argv[argv.index(flag) + 1] == "debug", (name, argv)
        if name != "dashboard":
            assert argv[argv.index("--log-format") + 1] == "text", (name, argv)


def test_up_passes_its_log_format_to_every_process_but_streamlit(tmp_path):
    data = a_config_dict(ledger={"data_dir": str(tmp_path / "ledger")}, scheduler={"enabled": True})
    path = write_config(tmp_path / "tally.yaml", data)
    stack = Stack(parse_config(data, str(path)), path, log_format="json")
    children = {child.name: child.argv for child in stack._children()}
    for name, argv in children.items():
        assert ("--log-format" in argv) is (name != "dashboard"), (name, argv)
        if name != "dashboard":
            assert argv[argv.index("--log-format") + 1] == "json"


@pytest.mark.parametrize("exists", [False, True], ids=["no-ledger", "a-ledger"])
def test_up_says_when_it_creates_the_ledger(tmp_path, capsys, exists):
    if exists:
        from ledger.store.hot import DuckDBStore

        DuckDBStore(tmp_path / "ledger").close()
    stack = _stack(tmp_path, "info")
    stack._banner(("127.0.0.1:9092",))
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.lstrip().startswith("ledger")]
    assert line.endswith(str(tmp_path / "ledger")) is exists
    assert ("(new: there was no ledger; the worker creates it)" in line) is not exists
