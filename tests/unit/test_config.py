"""Configuration validation: a bad file fails with the file, the field and the problem."""

from pathlib import Path

import pytest

from tally.config import ConfigError, load_config, parse_config
from tests.builders import a_config_dict
from tests.conftest import REPO, write_config


def test_the_documented_example_is_valid():
    config = load_config(REPO / "deploy/examples/tally.yaml")
    assert config.broker.mode == "embedded"
    assert config.price_book().rate_at("NVIDIA H100 80GB HBM3", "h100", 0) == 3_200_000
    assert config.organisation.cost_centre_of()["vision"] == "research"


def test_defaults_fill_what_is_left_out():
    config = parse_config(a_config_dict())
    assert config.topics.samples == "tally.samples"
    assert config.sampling.interval_s == 10
    assert config.ledger.currency == "USD"
    assert config.ledger.memory_limit() is None  # DuckDB's own, unless an operator sets one


def test_the_writer_memory_limit_can_be_set_or_left_to_duckdb():
    config = parse_config(a_config_dict(ledger={"duckdb_memory_limit": None}))
    assert config.ledger.memory_limit() is None
    assert (
        parse_config(a_config_dict(ledger={"duckdb_memory_limit": "128MiB"})).ledger.memory_limit()
        == 128 << 20
    )
    assert (
        parse_config(a_config_dict(ledger={"duckdb_memory_limit": "1GB"})).ledger.memory_limit()
        == 10**9
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        pytest.param(
            {"prices": [{"model": "NVIDIA H100 80GB HBM3", "per_gpu_hour": "abc"}]},
            "prices[0].per_gpu_hour: 'abc' is not a decimal amount",
            id="price-not-number",
        ),
        pytest.param(
            {"prices": [{"model": "NVIDIA H100 80GB HBM3", "per_gpu_hour": "1.0000001"}]},
            "prices[0].per_gpu_hour: '1.0000001' has more than six decimal places",
            id="price-too-precise",
        ),
        pytest.param(
            {"prices": [{"model": "NVIDIA H100 80GB HBM3", "per_gpu_hour": "-1"}]},
            "prices[0].per_gpu_hour: a price cannot be negative",
            id="negative-price",
        ),
        pytest.param(
            {"prices": [{"model": "Other", "per_gpu_hour": "1"}]},
            "uses model 'NVIDIA H100 80GB HBM3', which has no price",
            id="unpriced-fleet",
        ),
        pytest.param(
            {"broker": {"mode": "external"}},
            "broker: an external broker needs",
            id="external-without-servers",
        ),
        pytest.param(
            {"broker": {"mode": "external", "bootstrap_servers": ["nohost"]}},
            "'nohost' is not host:port",
            id="bad-bootstrap",
        ),
        pytest.param(
            {"broker": {"mode": "cloud"}},
            "broker.mode: Input should be 'embedded' or",
            id="unknown-broker-mode",
        ),
        pytest.param(
            {"sampling": {"interval_s": 0.5}},
            "sampling.interval_s: Input should be greater than or equal to 1",
            id="sampling-too-fast",
        ),
        pytest.param(
            {"ledger": {"currency": "dollars"}},
            "ledger.currency: String should match",
            id="bad-currency",
        ),
        pytest.param(
            {"ledger": {"duckdb_memory_limit": "lots"}},
            "ledger.duckdb_memory_limit: 'lots' is not a size such as 256MiB or 1GB",
            id="bad-memory-limit",
        ),
        pytest.param(
            {"topics": {"samples": "bad topic!"}},
            "topics.samples: names use letters",
            id="bad-topic-name",
        ),
        pytest.param(
            {"surprise": 1}, "surprise: Extra inputs are not permitted", id="unknown-section"
        ),
        pytest.param(
            {"fleet": {"pools": []}},
            "fleet.pools: Tuple should have at least 1 item",
            id="empty-fleet",
        ),
        pytest.param(
            {
                "organisation": {
                    "cost_centres": [
                        {"name": "a", "teams": [{"name": "t", "projects": ["p"]}]},
                        {"name": "b", "teams": [{"name": "t", "projects": ["q"]}]},
                    ]
                }
            },
            "team 't' appears twice",
            id="duplicate-team",
        ),
    ],
)
def test_invalid_config_names_file_field_and_problem(tmp_path, change, message):
    path = write_config(tmp_path / "bad.yaml", a_config_dict(**change))
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    text = str(caught.value)
    assert text.startswith(f"{path}: ")
    assert message in text


@pytest.mark.parametrize(
    ("content", "message"),
    [
        pytest.param(
            "broker: [unclosed",
            "line 1, column 18: not valid YAML: expected ',' or ']'",
            id="yaml-syntax",
        ),
        pytest.param("- just\n- a list\n", "must hold a mapping", id="not-a-mapping"),
        pytest.param("", "must hold a mapping", id="empty-file"),
    ],
)
def test_unreadable_config(tmp_path, content, message):
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        load_config(path)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "absent.yaml")


def test_yaml_float_price_is_read_from_its_text(tmp_path):
    config = parse_config(a_config_dict(prices=[{"model": "*", "per_gpu_hour": 2.35}]))
    assert config.prices[0].per_gpu_hour == 2_350_000


@pytest.mark.parametrize(
    ("section", "field", "value", "read"),
    [
        pytest.param(
            "ledger", "data_dir", "led", lambda c: c.ledger.data_dir, id="ledger-data-dir"
        ),
        pytest.param(
            "ledger", "data_dir", "../up/led", lambda c: c.ledger.data_dir, id="data-dir-upwards"
        ),
        pytest.param(
            "scheduler",
            "work_dir",
            "sched",
            lambda c: c.scheduler.work_dir,
            id="scheduler-work-dir",
        ),
        pytest.param(
            "scheduler",
            "tokens",
            {"file": "secret/tokens.yaml"},
            lambda c: c.scheduler.tokens.file,
            id="tokens-file",
        ),
    ],
)
def test_relative_paths_resolve_against_the_config_files_directory(
    tmp_path, monkeypatch, section, field, value, read
):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    conf_dir = tmp_path / "etc" / "tally"
    conf_dir.mkdir(parents=True)
    path = write_config(conf_dir / "c.yaml", a_config_dict(**{section: {field: value}}))
    relative = value["file"] if isinstance(value, dict) else value
    expected = (conf_dir / relative).resolve()
    assert read(load_config(path)) == expected
    # the same file named by a relative path from another directory means the same paths
    monkeypatch.chdir(conf_dir)
    assert read(load_config("c.yaml")) == expected


def test_absolute_paths_stay_and_a_dict_config_resolves_against_the_working_directory(tmp_path):
    absolute = tmp_path / "abs" / "led"
    path = write_config(tmp_path / "c.yaml", a_config_dict(ledger={"data_dir": str(absolute)}))
    assert load_config(path).ledger.data_dir == absolute
    from_dict = parse_config(a_config_dict(ledger={"data_dir": "led"}))
    assert from_dict.ledger.data_dir == Path("led")  # relative: to the current directory


def test_the_example_keeps_its_data_under_the_repository_whatever_the_directory(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    config = load_config(REPO / "deploy/examples/tally.yaml")
    assert config.ledger.data_dir == REPO.resolve() / ".tally" / "data"
    assert config.scheduler.tokens.file == REPO.resolve() / ".tally/scheduler/tokens.yaml"


@pytest.mark.parametrize(
    ("metrics", "process", "host"),
    [
        pytest.param({}, "collector", "127.0.0.1", id="default-loopback"),
        pytest.param({"host": "10.0.0.5"}, "collector", "10.0.0.5", id="shared-host"),
        pytest.param(
            {"host": "10.0.0.5", "collector_host": "0.0.0.0"},
            "collector",
            "0.0.0.0",
            id="collector-own-host",
        ),
        pytest.param({"collector_host": "0.0.0.0"}, "worker", "127.0.0.1", id="others-unchanged"),
    ],
)
def test_each_process_binds_its_own_metrics_host_or_the_shared_one(metrics, process, host):
    assert parse_config(a_config_dict(metrics=metrics)).metrics.host_of(process) == host


def test_two_processes_cannot_share_a_metrics_port():
    with pytest.raises(ConfigError, match="worker_port and collector_port must differ"):
        parse_config(a_config_dict(metrics={"collector_port": 9464}), "t.yaml")
    zeros = {"worker_port": 0, "scheduler_port": 0, "collector_port": 0, "alerts_port": 0}
    assert parse_config(a_config_dict(metrics=zeros)).metrics.port_of("alerts") == 0
