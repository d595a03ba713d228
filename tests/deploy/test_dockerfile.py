"""deploy/Dockerfile, read by dockerfile-parse (no container engine here): several stages, a
non-root final user, a HEALTHCHECK that really fails and passes against Tally's health
server, and a default command the real CLI accepts with a configuration that passes `tally
config check`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from tally.health import Check, Verdict
from tally.health_http import Probes, start_server
from tests.deploy.commands import DEPLOY, HEALTH_PATHS, REPO, config_check, parse_tally

pytestmark = pytest.mark.deploy

DOCKERFILE = DEPLOY / "Dockerfile"


@pytest.fixture(scope="module")
def instructions() -> list[dict[str, str]]:
    from dockerfile_parse import DockerfileParser

    parser = DockerfileParser(path=str(DOCKERFILE))
    return list(parser.structure)


def final_stage(instructions: list[dict[str, str]]) -> list[dict[str, str]]:
    starts = [i for i, ins in enumerate(instructions) if ins["instruction"] == "FROM"]
    return instructions[starts[-1] :]


def exec_form(value: str) -> list[str]:
    """An instruction's JSON (exec) form; the shell form would hide the program from checks."""
    parsed = json.loads(value)
    assert isinstance(parsed, list) and all(isinstance(a, str) for a in parsed), value
    return parsed


def env_of(stage: list[dict[str, str]]) -> dict[str, str]:
    """The stage's ENV, `KEY=VALUE` pairs (one ENV may set several)."""
    import shlex

    env: dict[str, str] = {}
    for ins in stage:
        if ins["instruction"] == "ENV":
            for pair in shlex.split(ins["value"]):
                key, _, value = pair.partition("=")
                env[key] = value
    return env


def test_multi_stage_build_copies_only_the_environment_into_the_final_stage(
    instructions: list[dict[str, str]],
) -> None:
    stages = [ins["value"].split() for ins in instructions if ins["instruction"] == "FROM"]
    assert len(stages) >= 2, "a build stage and a runtime stage"
    names = {words[-1] for words in stages if len(words) == 3 and words[1].upper() == "AS"}
    copies_from = [
        ins["value"]
        for ins in final_stage(instructions)
        if ins["instruction"] == "COPY" and ins["value"].startswith("--from=")
    ]
    assert copies_from, "the final stage takes what the build stage made"
    assert all(c.split()[0].removeprefix("--from=") in names for c in copies_from)
    assert not any(
        ins["instruction"] == "RUN" and "pip install" in ins["value"]
        for ins in final_stage(instructions)
    ), "no installs (no build tools) in the runtime stage"


def test_final_user_is_not_root(instructions: list[dict[str, str]]) -> None:
    users = [ins["value"] for ins in final_stage(instructions) if ins["instruction"] == "USER"]
    assert users, "the final stage sets USER"
    user = users[-1].split(":")[0]
    assert user not in {"root", "0"}


def test_entrypoint_and_command_are_a_tally_command_with_a_valid_config(
    instructions: list[dict[str, str]],
) -> None:
    stage = final_stage(instructions)
    entrypoint = [exec_form(i["value"]) for i in stage if i["instruction"] == "ENTRYPOINT"]
    cmd = [exec_form(i["value"]) for i in stage if i["instruction"] == "CMD"]
    assert entrypoint == [["tally"]]
    command = parse_tally(cmd[-1])
    copied = {
        ins["value"].split()[-1]: REPO / ins["value"].split()[-2]
        for ins in stage
        if ins["instruction"] == "COPY" and not ins["value"].startswith("--from=")
    }
    config = command.config_file(copied)
    config_check(config)
    assert env_of(stage)["TALLY_CONFIG"] in copied, "TALLY_CONFIG names the baked-in config"


@pytest.fixture
def health_server() -> Iterator[tuple[int, list[bool]]]:
    """Tally's real health server; `alive[0]` decides what `/healthz` answers."""
    alive = [True]

    def live() -> Verdict:
        return Verdict((("event_loop", Check(alive[0], "ticked" if alive[0] else "stalled")),))

    server, _ = start_server(
        __import__("prometheus_client").CollectorRegistry(), "127.0.0.1", 0, Probes(live, live)
    )
    try:
        yield server.server_port, alive
    finally:
        server.shutdown()


def test_healthcheck_passes_on_a_live_process_and_fails_on_a_dead_one(
    instructions: list[dict[str, str]], health_server: tuple[int, list[bool]]
) -> None:
    stage = final_stage(instructions)
    checks = [i["value"] for i in stage if i["instruction"] == "HEALTHCHECK"]
    assert len(checks) == 1
    words = checks[0].split("CMD", 1)
    assert len(words) == 2, "HEALTHCHECK … CMD […]"
    argv = exec_form(words[1].strip())
    default_url = env_of(stage)["TALLY_HEALTH_URL"]
    url = urlsplit(default_url)
    assert url.path in HEALTH_PATHS
    assert url.port == 9464, "the default command's process (the worker) serves there"
    port, alive = health_server
    local = urlunsplit(url._replace(netloc=f"127.0.0.1:{port}"))
    assert argv[0] == "python"
    env = {**os.environ, "TALLY_HEALTH_URL": local}

    def run() -> int:
        return subprocess.run(
            [sys.executable, *argv[1:]], check=False, env=env, timeout=30
        ).returncode

    assert run() == 0
    alive[0] = False
    assert run() != 0


def test_dockerignore_keeps_the_build_context_to_what_the_image_copies() -> None:
    ignore = Path(f"{DOCKERFILE}.dockerignore").read_text().splitlines()
    rules = [line for line in ignore if line and not line.startswith("#")]
    assert rules[0] == "*"
    assert "!deploy/compose/tally.yaml" in rules
