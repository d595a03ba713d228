"""`tally request …` on a real sealed ledger: what a request event looks like before it is
sent (`--dry-run`), the checks the CLI makes before sending (the token's role and team, the
request's approvers, never one's own request, only open requests), `expire`, and `list` / `show`
in every output format."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from ledger.admin.request_events import RequestRejected
from ledger.store.hot import DuckDBStore
from tally.cli import cli
from tests.builders import a_config_dict
from tests.conftest import write_config
from tests.unit.test_admin import admin_message, ingestor
from tests.unit.test_requests import BUDGET, LEAD, QID, QUOTA, RID, approve

TOKENS_FILE = {
    "admin": "req-admin-0123456789",
    "teams": {"vision": "req-vision-0123456789"},
    "tokens": [
        {"name": "books", "token": "req-finance-0123456789", "role": "finance"},
        {"name": "ops", "token": "req-operator-0123456789", "role": "operator"},
        {"name": "ada", "token": "req-ada-0123456789", "role": "member", "team": "vision",
         "user": "ada"},
        {"name": "cy", "token": "req-cy-0123456789", "role": "team-lead", "team": "language"},
    ],
}  # fmt: skip
OTHER = "req-aaaaaaaaaaaaaaaa"  # a second budget request, rejected


def requests_ledger(data_dir: Path) -> Path:
    """A sealed ledger holding an open budget request (RID), an open quota request (QID, long
    expired by now: 2026) and a rejected one."""
    from dataclasses import replace

    with DuckDBStore(data_dir) as store:
        ing = ingestor(store)
        far = BUDGET.effective_us + 10 * 365 * 86_400_000_000  # open for years
        other = replace(BUDGET, request_id=OTHER, reason="other", expires_us=far)
        ing.apply([admin_message(0, replace(BUDGET, expires_us=far), QUOTA, other)])
        ing.apply([admin_message(1, RequestRejected(OTHER, "fran", "no", BUDGET.effective_us))])
        store.seal()
    return data_dir


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return requests_ledger(tmp_path_factory.mktemp("requests") / "ledger")


@pytest.fixture
def config(tmp_path):
    (tmp_path / "tokens.yaml").write_text(yaml.safe_dump(TOKENS_FILE))
    data = a_config_dict(
        scheduler={"tokens": {"file": "tokens.yaml", "admin_env": None}},
        approvals={"budget": {"finance_over": "100.00"}, "expire_after_hours": 24},
    )
    return write_config(tmp_path / "tally.yaml", data)


def run(config, ledger, *args, token=None, actor="fran"):
    argv = ["request", *args, "--config", str(config), "--data-dir", str(ledger)]
    env = {"TALLY_TOKEN": token, "TALLY_ACTOR": actor}
    return CliRunner().invoke(cli, argv, env=env)


BUDGET_ARGS = ("budget", "--team", "vision", "--period", "2026-11", "--reason", "runs", "--dry-run")


@pytest.mark.parametrize(
    ("token", "args", "code", "text"),
    [
        pytest.param(
            "req-vision-0123456789",
            (*BUDGET_ARGS, "--money", "150.00"),
            0,
            "request budget 2026-11 money_micros +150000000 for vision: runs",
            id="lead-asks",
        ),
        pytest.param(
            "req-ada-0123456789", (*BUDGET_ARGS, "--gpu-hours", "10"), 0, "gpu_ms +36000000",
            id="member-asks",
        ),
        pytest.param(
            "req-cy-0123456789", (*BUDGET_ARGS, "--money", "1"), 2, "team vision is not yours",
            id="other-team-lead",
        ),
        pytest.param(
            "req-finance-0123456789", (*BUDGET_ARGS, "--money", "1"), 2,
            "role finance may not requests.open", id="finance-asks",
        ),
        pytest.param(None, (*BUDGET_ARGS, "--money", "0"), 2, "zero", id="zero"),
        pytest.param(None, BUDGET_ARGS, 2, "exactly one of", id="no-amount"),
        pytest.param(
            None,
            ("quota", "--team", "vision", "--pool", "h100", "--model", "H100", "--gpus", "4",
             "--borrowing-limit", "2", "--reason", "r", "--dry-run"),
            0, "borrowing 2, lending unlimited", id="quota",
        ),
    ],
)  # fmt: skip
def test_opening_a_request(config, ledger, token, args, code, text):
    result = run(config, ledger, *args, token=token)
    assert result.exit_code == code, result.output
    assert text in result.output
    assert not re.search(r"^sent ", result.output, re.MULTILINE)


@pytest.mark.parametrize(
    ("args", "token", "actor", "code", "text"),
    [
        pytest.param(("approve", RID), "req-finance-0123456789", "fran", 0, "approved request",
                     id="finance-approves"),
        pytest.param(("reject", RID), "req-admin-0123456789", "root", 0, "rejected request",
                     id="admin-rejects"),
        pytest.param(("approve", RID), "req-finance-0123456789", LEAD, 2, "never the requester",
                     id="own-request"),
        pytest.param(("approve", RID), "req-operator-0123456789", "op", 2, "needs an admin",
                     id="operator"),
        pytest.param(("approve", RID), "req-vision-0123456789", "x", 2,
                     "role team-lead may not requests.decide", id="team-lead"),
        pytest.param(("approve", QID), None, "root", 2, f"request {QID} is expired",
                     id="expired"),
        pytest.param(("approve", OTHER), None, "root", 2, "is rejected, not open",
                     id="decided"),
        pytest.param(("approve", "req-0000000000000000"), None, "root", 2, "no request",
                     id="unknown"),
    ],
)  # fmt: skip
def test_deciding_a_request(config, ledger, args, token, actor, code, text):
    result = run(config, ledger, *args, "--comment", "c", "--dry-run", token=token, actor=actor)
    assert result.exit_code == code, result.output
    assert text in result.output


def test_expire_names_the_open_requests_past_their_expiry(config, ledger):
    result = run(config, ledger, "expire", "--dry-run")
    assert result.exit_code == 0, result.output
    assert f"expired request {QID}" in result.output and RID not in result.output


@pytest.mark.parametrize(
    ("token", "expected"),
    [
        pytest.param(None, {RID: "open", QID: "expired", OTHER: "rejected"}, id="operator"),
        pytest.param(
            "req-ada-0123456789", {RID: "open", QID: "expired", OTHER: "rejected"}, id="member"
        ),
        pytest.param("req-cy-0123456789", {}, id="other-team"),
    ],
)
def test_list_shows_each_callers_requests_with_their_status_now(config, ledger, token, expected):
    result = run(config, ledger, "list", "-o", "json", token=token)
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert {r["request"]: r["status"] for r in rows} == expected
    if rows:
        assert rows[0]["requested_by"] == LEAD and rows[0]["approvers"] == "admin, finance"


def test_show_hides_another_teams_request(config, ledger):
    mine = run(config, ledger, "show", RID, "-o", "json", token="req-ada-0123456789")
    assert mine.exit_code == 0 and json.loads(mine.stdout)[0]["reason"] == "more runs"
    hidden = run(config, ledger, "show", RID, token="req-cy-0123456789")
    assert hidden.exit_code == 2 and f"no request {RID}" in hidden.output


def test_an_approval_the_ledger_applies_shows_its_effect(tmp_path, config):
    with DuckDBStore(tmp_path / "l") as store:
        ingestor(store).apply([admin_message(0, BUDGET, approve())])
        store.seal()
    result = run(config, tmp_path / "l", "show", RID, "-o", "csv")
    assert result.exit_code == 0, result.output
    assert ",approved," in result.stdout and "fran" in result.stdout
