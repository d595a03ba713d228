"""deploy/systemd: each unit passes `systemd-analyze verify` (Debian's systemd; the unit's
`tally` path pointed at this checkout's), and its ExecStart is a command the real CLI
accepts, with /etc/tally/tally.yaml (deploy/systemd/tally.yaml) passing `tally config check`
and every secret that configuration names coming from the units' EnvironmentFile."""

from __future__ import annotations

import configparser
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy.commands import (
    DEPLOY,
    TallyCommand,
    config_check,
    parse_tally,
    secret_variables,
    serves_outside,
)

pytestmark = pytest.mark.deploy

SYSTEMD = DEPLOY / "systemd"
UNITS = sorted(p.name for p in SYSTEMD.glob("*.service"))
INSTALLED_TALLY = "/opt/tally/bin/tally"
MOUNTS = {"/etc/tally/tally.yaml": SYSTEMD / "tally.yaml"}
ENV_FILE = "/etc/tally/tally.env"


def unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string((SYSTEMD / name).read_text())
    return parser


def exec_start(name: str) -> TallyCommand:
    argv = shlex.split(unit(name)["Service"]["ExecStart"])
    assert argv[0] == INSTALLED_TALLY
    return parse_tally(argv[1:])


def test_the_site_has_a_unit_for_every_process() -> None:
    commands = {exec_start(name).path for name in UNITS}
    assert {
        ("collect",),
        ("worker",),
        ("scheduler", "run"),
        ("dashboard",),
        ("alerts", "run"),
    } == commands


def test_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.fail("systemd-analyze not found: install Debian's systemd (.ci/run does)")
    here = Path(sys.executable).parent / "tally"
    assert here.exists(), "the tally entry point beside this interpreter"
    for name in UNITS:
        text = (SYSTEMD / name).read_text().replace(INSTALLED_TALLY, str(here))
        (tmp_path / name).write_text(text)
    done = subprocess.run(
        [analyze, "verify", "--man=no", *(str(tmp_path / n) for n in UNITS)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    # unknown keys and unparsable values are only warnings: any output fails
    assert done.returncode == 0 and not (done.stdout + done.stderr).strip(), done.stderr


def test_systemd_analyze_verify_catches_a_broken_unit(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.fail("systemd-analyze not found: install Debian's systemd (.ci/run does)")
    broken = tmp_path / "broken.service"
    broken.write_text("[Service]\nExecStart=/bin/true\nRestartPreventExitStatus=two\n")
    done = subprocess.run(
        [analyze, "verify", "--man=no", str(broken)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.stdout + done.stderr).strip()


@pytest.mark.parametrize("name", UNITS)
def test_exec_start_is_a_real_tally_command_with_a_valid_config(name: str) -> None:
    command = exec_start(name)
    config = config_check(command.config_file(MOUNTS))
    service = unit(name)["Service"]
    secrets = secret_variables(config, command)
    if secrets:
        assert service.get("EnvironmentFile", "").lstrip("-") == ENV_FILE, name
        listed = (SYSTEMD / "tally.env.example").read_text()
        for variable in secrets:
            assert f"\n{variable}=" in listed, f"{variable} missing from tally.env.example"
    assert service["User"] == "tally", "no unit runs as root"
    assert service["RestartPreventExitStatus"] == "2", "a bad configuration is not retried"
    if command.path == ("collect",):
        assert command.params["source"] == "nvml"
        assert service["AmbientCapabilities"] == "CAP_SYS_PTRACE"
        assert serves_outside(config, command), "Prometheus scrapes each GPU node"
    if command.path == ("scheduler", "run"):
        assert config.scheduler.executor == "slurm"


def test_without_object_storage_the_readers_share_the_workers_directory_on_one_host() -> None:
    """The site keeps the sealed ledger in the worker's data directory (no `segments_url`):
    that is sound only with the worker, the dashboard and alert delivery on one host, the
    worker and alert delivery writing under their state directory and the dashboard reading it
    (it writes nothing there)."""
    by_path = {exec_start(name).path: name for name in UNITS}
    config = config_check(exec_start(by_path[("worker",)]).config_file(MOUNTS))
    assert config.ledger.segments_url is None
    data_dir = config.ledger.data_dir
    for path in (("worker",), ("alerts", "run")):
        service = unit(by_path[path])["Service"]
        state = Path("/var/lib") / service["StateDirectory"]
        assert data_dir.is_relative_to(state), f"{by_path[path]}: {data_dir} is not writable"
    dashboard = unit(by_path[("dashboard",)])["Service"]
    assert "StateDirectory" not in dashboard, "the dashboard writes nothing on the ledger host"
    assert any(data_dir.is_relative_to(p) for p in dashboard["ReadOnlyPaths"].split())
