"""deploy/compose/compose.yaml: valid against the Compose Specification's JSON schema
(vendored in tests/fixtures/compose_spec, see its SOURCE.md), and every Tally service runs a
command the real CLI accepts, with a configuration that passes `tally config check`, the
secrets that configuration names, and a health check on the endpoint its process serves; the
sealed ledger lives on the MinIO service, which the readers pull from instead of sharing the
worker's volume."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import pytest
import yaml

from tests.deploy.commands import (
    DASHBOARD_HEALTH_PATH,
    HEALTH_PATHS,
    REPO,
    TallyCommand,
    config_check,
    metrics_port,
    parse_tally,
    secret_variables,
    serves_outside,
)

pytestmark = pytest.mark.deploy

COMPOSE = REPO / "deploy" / "compose" / "compose.yaml"
SCHEMA = REPO / "tests" / "fixtures" / "compose_spec" / "compose-spec.json"
TALLY_SERVICES = ("worker", "collector", "scheduler", "admin", "dashboard", "alerts")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict)
    return data


def test_the_file_is_valid_against_the_compose_specification(compose: dict[str, Any]) -> None:
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(compose), key=str)
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors)


def test_the_schema_refuses_what_compose_refuses(compose: dict[str, Any]) -> None:
    """The check can fail: a misspelt key and a wrong type are errors under this schema."""
    schema = json.loads(SCHEMA.read_text())
    broken = json.loads(json.dumps(compose))
    broken["services"]["worker"]["comand"] = ["worker"]
    broken["services"]["kafka"]["restart"] = ["always"]
    errors = list(jsonschema.Draft7Validator(schema).iter_errors(broken))
    assert len(errors) == 2


def test_the_stack_has_kafka_in_kraft_mode_and_one_worker(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(TALLY_SERVICES) | {"kafka", "minio", "bucket"} == set(services)
    kafka = services["kafka"]
    assert kafka["image"].startswith("apache/kafka:")
    assert "broker" in kafka["environment"]["KAFKA_PROCESS_ROLES"]
    assert "controller" in kafka["environment"]["KAFKA_PROCESS_ROLES"]
    assert "ZOOKEEPER" not in json.dumps(kafka).upper()
    # the deployments run one worker (ledger.sharded is not set): one worker
    assert "deploy" not in services["worker"] or services["worker"]["deploy"]["replicas"] == 1


def tally_command(service: dict[str, Any]) -> TallyCommand:
    command = service["command"]
    assert isinstance(command, list), "exec form: the image's ENTRYPOINT is `tally`"
    return parse_tally(command)


def mounts(service: dict[str, Any]) -> dict[str, Path]:
    """Files of this directory bind-mounted into the service: container path → file."""
    found: dict[str, Path] = {}
    for volume in service.get("volumes", []):
        source, target, *_ = volume.split(":")
        if source.startswith("."):
            found[target] = (COMPOSE.parent / source).resolve()
    return found


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    assert isinstance(env, dict)
    return {k: str(v) for k, v in env.items()}


@pytest.mark.parametrize("name", TALLY_SERVICES)
def test_service_runs_a_real_tally_command_with_a_valid_config(
    compose: dict[str, Any], name: str
) -> None:
    service = compose["services"][name]
    command = tally_command(service)
    config = config_check(command.config_file(mounts(service)))
    env = environment(service)
    for variable in secret_variables(config, command):
        assert variable in env, f"{name}: {variable} is not passed to the container"
        assert re.fullmatch(r"\$\{" + variable + r"(:[?-].*)?\}", env[variable]), (
            f"{name}: {variable} comes from the environment of `docker compose`, not the file"
        )
    if command.path != ("admin", "apply"):
        assert config.broker.mode == "external"
        assert config.broker.bootstrap_servers == ("kafka:9092",)


@pytest.mark.parametrize("name", ["worker", "collector", "scheduler", "alerts"])
def test_health_check_hits_the_port_the_process_serves(compose: dict[str, Any], name: str) -> None:
    service = compose["services"][name]
    command = tally_command(service)
    config = config_check(command.config_file(mounts(service)))
    url = urlsplit(environment(service)["TALLY_HEALTH_URL"])
    assert url.path in HEALTH_PATHS
    assert url.port == metrics_port(config, command)
    assert "disable" not in service.get("healthcheck", {})
    assert serves_outside(config, command) or url.hostname == "127.0.0.1"


def test_dashboard_health_check_and_port(compose: dict[str, Any]) -> None:
    service = compose["services"]["dashboard"]
    command = tally_command(service)
    config = config_check(command.config_file(mounts(service)))
    url = urlsplit(environment(service)["TALLY_HEALTH_URL"])
    assert url.path == DASHBOARD_HEALTH_PATH
    assert url.port == config.dashboard.port
    assert config.dashboard.host == "0.0.0.0", "reachable through the published port"
    assert f"127.0.0.1:{config.dashboard.port}:{config.dashboard.port}" in service["ports"]


def _config_of(services: dict[str, Any], name: str) -> Any:
    return config_check(tally_command(services[name]).config_file(mounts(services[name])))


def test_the_sealed_ledger_lives_on_minio_and_no_volume_is_shared(compose: dict[str, Any]) -> None:
    services = compose["services"]
    worker = _config_of(services, "worker")
    url = urlsplit(worker.ledger.segments_url)
    assert (url.scheme, worker.ledger.object_store.endpoint_url) == ("s3", "http://minio:9000")
    bucket = services["bucket"]
    assert f"mb --ignore-existing objects/{url.netloc}" in " ".join(bucket["command"])
    assert bucket["depends_on"]["minio"]["condition"] == "service_healthy"
    assert services["worker"]["depends_on"]["bucket"] == {
        "condition": "service_completed_successfully"
    }
    minio = environment(services["minio"])
    store = worker.ledger.object_store
    for reader in ("dashboard", "admin"):
        config = _config_of(services, reader)
        assert (config.ledger.segments_url, config.ledger.data_dir) == (
            worker.ledger.segments_url,
            worker.ledger.data_dir,
        )
    # MinIO's user and password are the variables the object store's credentials name
    assert minio["MINIO_ROOT_USER"].startswith("${" + store.access_key_id_env + ":?")
    assert minio["MINIO_ROOT_PASSWORD"].startswith("${" + store.secret_access_key_env + ":?")
    named = {
        name: {v.split(":")[0] for v in services[name].get("volumes", []) if v[0] != "."}
        for name in TALLY_SERVICES
    }
    for name, volumes in named.items():
        assert volumes <= set(compose["volumes"]), name
        for other, theirs in named.items():
            assert other == name or not volumes & theirs, f"{name} and {other} share a volume"
        mount = [v for v in services[name].get("volumes", []) if v.endswith(":ro")]
        assert all(v.startswith("./") for v in mount), f"{name}: a read-only ledger volume"
