"""The scheduler's configuration: `queues:` and `scheduler:` validation, the translation to the
core's values (`tally.scheduling`), the inventory, and API tokens from a file or the
environment — never from the configuration itself."""

from __future__ import annotations

import os

import pytest
import yaml

from ledger.roles import Role
from scheduler.model import US_PER_MINUTE, IdleAction, OverBudget, QueueClass
from tally.config import ConfigError, load_config, parse_config
from tally.scheduling import (
    ensure_tokens_file,
    inventory_of,
    load_tokens,
    queues_of,
    service_settings,
    teams_of,
)
from tests.conftest import REPO
from tests.unit.test_scheduler_service_support import config_data

TOKEN = "t" * 24


def test_queues_translate_with_class_defaults_and_explicit_policies(tmp_path):
    config = parse_config(config_data(tmp_path), "t.yaml")
    dev, train, serve = queues_of(config)
    assert (dev.queue_class, dev.idle.action, dev.idle.after_us) == (
        QueueClass.DEV,
        IdleAction.RECLAIM,
        10 * US_PER_MINUTE,
    )
    assert (train.idle.action, train.max_retries, train.max_runtime_us) == (
        IdleAction.ALERT,
        1,
        3_600_000_000,
    )
    assert (serve.preemptible, serve.priority, serve.idle.action) == (False, 10, IdleAction.NEVER)
    assert all(q.over_budget is OverBudget.WAIT for q in (dev, train, serve))


def test_teams_get_their_quotas_and_cohorts(tmp_path):
    config = parse_config(config_data(tmp_path), "t.yaml")
    vision, language = teams_of(config)
    assert (vision.name, vision.cohort, vision.quotas[0].nominal) == ("vision", "research", 2)
    assert language.cohort == "research"


def test_the_inventory_is_the_simulated_fleet_with_device_indices(tmp_path):
    config = parse_config(config_data(tmp_path), "t.yaml")
    inventory = inventory_of(config)
    (node,) = inventory.nodes
    assert (node.name, node.pool, node.model, len(node.gpu_uuids)) == (
        "a100-node-00",
        "a100",
        "A100",
        4,
    )
    assert [inventory.device_ids[u] for u in node.gpu_uuids] == ["0", "1", "2", "3"]


def test_the_example_configuration_builds_a_scheduler():
    example = REPO / "deploy" / "examples" / "tally.yaml"
    config = load_config(example)
    assert [q.name for q in queues_of(config)] == ["dev", "training", "inference"]
    settings = service_settings(config, ("127.0.0.1:9092",))
    assert (settings.api_port, settings.ledger_group) == (8600, "tally-ledger")
    text = example.read_text()
    assert "token:" not in text.replace("tokens:", "")  # no literal secret in the example


@pytest.mark.parametrize(
    ("configured", "interval_s"),
    [(None, 0.0005), (250, 0.00025), (5_000, 0.005)],
    ids=["default-half-a-millisecond", "quarter-millisecond", "python-default"],
)
def test_the_gil_switch_interval_reaches_the_service_in_seconds(tmp_path, configured, interval_s):
    data = config_data(tmp_path)
    if configured is not None:
        data["scheduler"]["gil_switch_interval_us"] = configured
    settings = service_settings(parse_config(data, "t.yaml"), ("127.0.0.1:9092",))
    assert settings.gil_switch_interval_s == pytest.approx(interval_s)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"queues": [{"name": "q", "class": "batch"}]}, "queues[0].class"),
        ({"queues": [{"name": "q", "class": "dev"}, {"name": "q", "class": "dev"}]}, "unique"),
        (
            {
                "queues": [
                    {
                        "name": "q",
                        "class": "dev",
                        "preemptible": False,
                        "run_preemptible_when_over_budget": True,
                    }
                ]
            },
            "needs a preemptible queue",
        ),
        ({"queues": [{"name": "q", "class": "dev", "idle_reclaim": "sometimes"}]}, "idle_reclaim"),
        (
            {
                "queues": [
                    {
                        "name": "q",
                        "class": "dev",
                        "idle_reclaim": {"reclaim_after_min": 5, "alert_after_min": 5},
                    }
                ]
            },
            "exactly one",
        ),
        ({"queues": [{"name": "q", "class": "dev", "retry_limit": -1}]}, "retry_limit"),
        ({"scheduler": {"teams": [{"name": "ghosts"}]}}, "unknown team 'ghosts'"),
        ({"scheduler": {"port": 0}}, "scheduler.port"),
        ({"scheduler": {"tokens": {"team_env": {"vision": "NOT VALID"}}}}, "environment"),
        ({"scheduler": {"tokens": {"team_env": {"ghosts": "X"}}}}, "unknown team"),
        ({"scheduler": {"tokens": {"secret": "abc"}}}, "scheduler.tokens.secret"),
        ({"scheduler": {"gil_switch_interval_us": 0}}, "scheduler.gil_switch_interval_us"),
        ({"scheduler": {"gil_switch_interval_us": 10**6}}, "scheduler.gil_switch_interval_us"),
    ],
    ids=[
        "unknown-class",
        "duplicate-queue",
        "over-budget-needs-preemptible",
        "unknown-idle-policy",
        "two-idle-actions",
        "negative-retries",
        "unknown-scheduler-team",
        "bad-port",
        "bad-env-name",
        "token-env-for-unknown-team",
        "literal-token-field",
        "no-gil-switch-interval",
        "gil-switch-interval-of-a-second",
    ],
)
def test_invalid_scheduler_configuration_is_refused_with_its_location(tmp_path, change, message):
    data = config_data(tmp_path)
    data.update(change)
    with pytest.raises(ConfigError) as raised:
        parse_config(data, "t.yaml")
    assert message in str(raised.value)


def _config_with_tokens(tmp_path, **tokens):
    data = config_data(tmp_path)
    data["scheduler"]["tokens"] = tokens
    return parse_config(data, "t.yaml", tmp_path)


def test_tokens_come_from_the_file_and_the_environment_wins(tmp_path):
    path = tmp_path / "tokens.yaml"
    path.write_text(yaml.safe_dump({"admin": "a" * 20, "teams": {"vision": "v" * 20}}))
    config = _config_with_tokens(
        tmp_path, file="tokens.yaml", team_env={"language": "LANG_TOKEN", "vision": "VIS_TOKEN"}
    )
    tokens = load_tokens(config, {"LANG_TOKEN": "l" * 20, "TALLY_ADMIN_TOKEN": "b" * 20})
    assert tokens.admin == "b" * 20
    assert dict(tokens.teams) == {"vision": "v" * 20, "language": "l" * 20}
    assert tokens.principal("v" * 20).team == "vision"
    assert tokens.principal("b" * 20).role is Role.ADMIN
    assert tokens.principal("a" * 20) is None  # the file's admin token was overridden


@pytest.mark.parametrize(
    ("content", "environ", "message"),
    [
        ({"admin": "short"}, {}, "16+ characters"),
        ({"admin": TOKEN, "teams": {"vision": TOKEN}}, {}, "share a token"),
        ({"teams": {"ghosts": TOKEN}}, {}, "unknown team"),
        (["not", "a", "mapping"], {}, "expected a mapping"),
        ({"teams": {"vision": 12345}}, {}, "team → token"),
    ],
    ids=["too-short", "shared", "unknown-team", "not-a-mapping", "not-a-string"],
)
def test_bad_tokens_stop_the_scheduler_with_a_message(tmp_path, content, environ, message):
    (tmp_path / "tokens.yaml").write_text(yaml.safe_dump(content))
    config = _config_with_tokens(tmp_path, file="tokens.yaml", admin_env=None)
    with pytest.raises(ConfigError) as raised:
        load_tokens(config, environ)
    assert message in str(raised.value)


def test_up_creates_a_private_tokens_file_once(tmp_path):
    config = _config_with_tokens(tmp_path, file="secrets/tokens.yaml")
    path = ensure_tokens_file(config)
    assert path == tmp_path / "secrets" / "tokens.yaml"
    assert os.stat(path).st_mode & 0o777 == 0o600
    first = path.read_text()
    tokens = load_tokens(config, {})
    assert tokens.admin and set(tokens.teams) == {"vision", "language"}
    ensure_tokens_file(config)
    assert path.read_text() == first  # never overwritten


@pytest.mark.parametrize(
    ("executor", "kind"),
    [
        pytest.param("local", "LocalExecutor", id="local-by-default"),
        pytest.param("slurm", "SlurmExecutor", id="slurm-when-configured"),
    ],
)
def test_the_configured_executor_is_built(tmp_path, executor, kind):
    from tally.config import parse_config
    from tally.scheduling import configured_executor, inventory_of
    from tests.builders import a_config_dict

    data = a_config_dict(
        scheduler={"executor": executor, "work_dir": str(tmp_path), "slurm": {"partition": "gpu"}}
    )
    config = parse_config(data)
    built = configured_executor(config, inventory_of(config))
    assert type(built).__name__ == kind
