"""Secrets from environment variables: every secret field has an `*_env` twin naming the
variable; a variable that is named but not set is a configuration error naming the field and
the variable (exit 2 from the commands that need it)."""

from __future__ import annotations

import pytest
import yaml
from click.testing import CliRunner

from tally.cli import cli
from tally.config import ConfigError, parse_config
from tally.scheduling import load_tokens
from tests.builders import a_config_dict
from tests.conftest import write_config

TOKEN = "t" * 20


def _sinks(*sinks: dict) -> dict:
    return a_config_dict(alerts={"sinks": list(sinks)})


def test_a_webhook_url_and_headers_come_from_the_environment():
    config = parse_config(
        _sinks(
            {
                "name": "chat",
                "kind": "slack",
                "url_env": "SLACK_HOOK",
                "headers": {"X-Team": "ops", "Authorization": "overridden"},
                "headers_env": {"Authorization": "HOOK_AUTH"},
            }
        )
    )
    environ = {"SLACK_HOOK": "https://hooks.example/T/B/secret", "HOOK_AUTH": "Bearer s3cret"}
    (sink,) = config.alerts.sink_settings(environ)
    assert sink.url == "https://hooks.example/T/B/secret"
    assert dict(sink.headers) == {"X-Team": "ops", "Authorization": "Bearer s3cret"}


@pytest.mark.parametrize(
    ("sink", "environ", "message"),
    [
        pytest.param(
            {"url_env": "SLACK_HOOK"},
            {},
            "alerts.sinks[chat].url_env: environment variable SLACK_HOOK is not set",
            id="url-variable-unset",
        ),
        pytest.param(
            {"url_env": "SLACK_HOOK"},
            {"SLACK_HOOK": ""},
            "alerts.sinks[chat].url_env: environment variable SLACK_HOOK is not set",
            id="url-variable-empty",
        ),
        pytest.param(
            {"url_env": "SLACK_HOOK"},
            {"SLACK_HOOK": "ftp://nope"},
            "alerts.sinks[chat].url_env: $SLACK_HOOK: expected an http:// or https:// URL",
            id="url-variable-not-a-url",
        ),
        pytest.param(
            {"url": "https://h.example/x", "headers_env": {"Authorization": "HOOK_AUTH"}},
            {},
            "alerts.sinks[chat].headers_env.Authorization: environment variable HOOK_AUTH "
            "is not set",
            id="header-variable-unset",
        ),
    ],
)
def test_a_missing_secret_names_the_field_and_the_variable(sink, environ, message):
    config = parse_config(_sinks({"name": "chat", "kind": "slack", **sink}))
    with pytest.raises(ConfigError) as raised:
        config.alerts.sink_settings(environ)
    assert str(raised.value) == message


@pytest.mark.parametrize(
    ("sink", "message"),
    [
        pytest.param({}, "give exactly one of url or url_env", id="neither"),
        pytest.param(
            {"url": "https://h.example/x", "url_env": "HOOK"},
            "give exactly one of url or url_env",
            id="both",
        ),
        pytest.param({"url_env": "NOT VALID"}, "environment variable name", id="bad-name"),
    ],
)
def test_a_sink_needs_one_url_source(sink, message):
    with pytest.raises(ConfigError, match=message):
        parse_config(_sinks({"name": "chat", "kind": "slack", **sink}), "t.yaml")


def _tokens_config(tmp_path, file_content: dict | None, **tokens):
    if file_content is not None:
        (tmp_path / "tokens.yaml").write_text(yaml.safe_dump(file_content))
        tokens["file"] = "tokens.yaml"
    return parse_config(a_config_dict(scheduler={"tokens": tokens}), "t.yaml", tmp_path)


@pytest.mark.parametrize(
    ("file_content", "tokens", "message"),
    [
        pytest.param(
            None,
            {"team_env": {"vision": "VISION_TOKEN"}},
            "scheduler.tokens.team_env.vision: environment variable VISION_TOKEN is not set",
            id="team-variable-unset-no-file",
        ),
        pytest.param(
            {"admin": TOKEN},
            {"team_env": {"vision": "VISION_TOKEN"}},
            "scheduler.tokens.team_env.vision: environment variable VISION_TOKEN is not set",
            id="team-variable-unset-file-lacks-team",
        ),
        pytest.param(
            None,
            {"admin_env": "MY_ADMIN"},
            "scheduler.tokens.admin_env: environment variable MY_ADMIN is not set",
            id="explicit-admin-variable-unset",
        ),
    ],
)
def test_a_token_variable_not_set_is_an_error_unless_the_file_has_it(
    tmp_path, file_content, tokens, message
):
    config = _tokens_config(tmp_path, file_content, **tokens)
    with pytest.raises(ConfigError) as raised:
        load_tokens(config, {})
    assert str(raised.value) == message


def test_the_tokens_file_covers_an_unset_variable_and_a_set_one_wins(tmp_path):
    other = "o" * 20
    config = _tokens_config(
        tmp_path,
        {"admin": TOKEN, "teams": {"vision": "v" * 20}},
        admin_env="MY_ADMIN",
        team_env={"vision": "VISION_TOKEN", "language": "LANGUAGE_TOKEN"},
    )
    tokens = load_tokens(config, {"LANGUAGE_TOKEN": other})
    assert tokens.admin == TOKEN
    assert dict(tokens.teams) == {"vision": "v" * 20, "language": other}


def test_alerts_run_without_the_webhook_variable_exits_2_naming_it(tmp_path, monkeypatch):
    path = write_config(
        tmp_path / "c.yaml",
        _sinks({"name": "chat", "kind": "slack", "url_env": "TALLY_TEST_UNSET_HOOK"}),
    )
    monkeypatch.delenv("TALLY_TEST_UNSET_HOOK", raising=False)
    args = ["alerts", "run", "--config", str(path), "--bootstrap", "127.0.0.1:1"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert (
        "alerts.sinks[chat].url_env: environment variable TALLY_TEST_UNSET_HOOK is not set"
        in result.stderr
    )
