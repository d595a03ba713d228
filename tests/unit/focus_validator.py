"""The FinOps Foundation's `focus-validator` (FOCUS ≤ 1.0), run in a virtualenv of its own.

It pins numpy 1.x and pandera 0.17, which the project's environment cannot hold, so it lives in
`.venv-focus/` at the repository root, made on first use from `tests/focus_validator.txt` (and
remade when that file changes) and run as a subprocess. Failing to make it is an error, never a
skip: CI has PyPI. Its rules pinned off, each with the reason, are in
`tests/focus_validator_overrides.yaml`.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VENV = REPO / ".venv-focus"
REQUIREMENTS = REPO / "tests" / "focus_validator.txt"
OVERRIDES = REPO / "tests" / "focus_validator_overrides.yaml"
_STAMP = VENV / ".installed"


def validator_python() -> Path:
    """The validator venv's interpreter, creating and installing the venv when needed."""
    python = VENV / "bin" / "python"
    digest = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()
    if python.exists() and _STAMP.is_file() and _STAMP.read_text() == digest:
        return python
    shutil.rmtree(VENV, ignore_errors=True)
    steps = [
        [sys.executable, "-m", "venv", str(VENV)],
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-deps",
            "-r",
            str(REQUIREMENTS),
        ],
    ]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(
                f"cannot install focus-validator ({' '.join(step)}):\n{done.stdout}{done.stderr}"
            )
    _STAMP.write_text(digest)
    return python


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the validator said: every check by name, and the failed or errored ones."""

    checks: tuple[str, ...]
    skipped: tuple[str, ...]
    failed: tuple[str, ...]


def run_validator(python: Path, data: Path, report: Path, version: str = "1.0") -> Outcome:
    """Validate `data` (CSV or Parquet) against FOCUS `version` with the pinned-off rules."""
    site = subprocess.run(
        [
            str(python),
            "-c",
            "import focus_validator, pathlib; "
            "print(pathlib.Path(focus_validator.__file__).parents[1])",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    done = subprocess.run(
        [
            str(python),
            "-m",
            "focus_validator.main",
            "--data-file",
            str(data),
            "--validate-version",
            version,
            "--override-file",
            str(OVERRIDES),
            "--output-type",
            "unittest",
            "--output-destination",
            str(report),
        ],
        # It reads its ISO 4217 list from a path relative to the working directory.
        cwd=site,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0 or not report.is_file():
        raise RuntimeError(f"focus-validator did not run:\n{done.stdout}{done.stderr}")
    checks, skipped, failed = [], [], []
    for case in ET.parse(report).getroot().iter("testcase"):
        name = case.attrib["name"].split(" :: ")[0]
        checks.append(name)
        if case.find("skipped") is not None:
            skipped.append(name)
        if case.find("failure") is not None or case.find("error") is not None:
            failed.append(name)
    return Outcome(tuple(checks), tuple(skipped), tuple(failed))
