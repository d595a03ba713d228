"""The self-service portal's pure parts (`dashboard.portal_view`): GPU-hours and cost so far of
a job from the API's job view (integers, priced with the configuration's price book), the jobs
table's wait reasons and cancel offers, the saved templates from the configuration to the
submission body, what a team has left; and the environment `tally` hands the portal."""

from __future__ import annotations

from typing import Any

import pytest

from dashboard import portal_api, portal_view
from dashboard.portal_view import (
    JobRow,
    Left,
    Template,
    cost_so_far,
    gpu_ms_so_far,
    job_rows,
    left_of,
    submit_body,
    templates_from_json,
)
from tally import portal_config
from tally.config import parse_config
from tally.dashboard_login import portal_env
from tally.portal_config import JobTemplateConfig, templates_json
from tests.builders import a_config_dict

H100 = "NVIDIA H100 80GB HBM3"  # 3.20 per GPU-hour in pool h100 (tests.builders)
T0 = 1_793_491_200_000_000
MINUTE = 60_000_000
PRICES = parse_config(a_config_dict()).price_book()


def a_view(**overrides: Any) -> dict[str, Any]:
    view: dict[str, Any] = {
        "job_id": "job-1",
        "user": "ada",
        "state": "running",
        "reason": "",
        "queue": "dev",
        "gpus": 2,
        "submitted_us": T0,
        "started_us": T0,
        "ended_us": None,
        "assigned": {"pool": "h100", "model": H100},
    }
    view.update(overrides)
    return view


@pytest.mark.parametrize(
    ("view", "now", "gpu_ms"),
    [
        (a_view(state="pending", started_us=None), T0 + 90 * MINUTE, 0),
        (a_view(), T0 + 90 * MINUTE, 2 * 90 * 60_000),
        (a_view(state="cancelled", ended_us=T0 + 30 * MINUTE), T0 + 90 * MINUTE, 2 * 30 * 60_000),
        (a_view(started_us=T0 + MINUTE), T0, 0),  # a clock behind the start: never negative
    ],
    ids=["pending", "running-to-now", "ended-at-its-end", "clock-behind"],
)
def test_gpu_ms_so_far(view, now, gpu_ms):
    assert gpu_ms_so_far(view, now) == gpu_ms


@pytest.mark.parametrize(
    ("view", "gpu_ms", "prices", "cost"),
    [
        (a_view(), 3_600_000, PRICES, 3_200_000),  # one GPU-hour at 3.20
        (a_view(), 1_000, PRICES, 889),  # 3.2e6 × 1000 / 3.6e6 = 888.9 → 889
        (a_view(), 3_600_000, None, None),  # no price book: not priced here
        (a_view(assigned={"pool": "h100", "model": "T4"}), 3_600_000, PRICES, None),
        (a_view(state="pending", started_us=None, assigned={}), 0, PRICES, 0),
    ],
    ids=["one-gpu-hour", "rounded-half-even", "no-price-book", "no-price-for-model", "pending"],
)
def test_cost_so_far(view, gpu_ms, prices, cost):
    assert cost_so_far(view, gpu_ms, prices) == cost


def test_job_rows_newest_first_with_wait_reasons_and_what_can_be_cancelled():
    views = [
        a_view(job_id="old", state="finished", ended_us=T0 + MINUTE, reason="exit 0"),
        a_view(
            job_id="waits", state="pending", started_us=None, assigned={},
            reason="quota_exhausted", submitted_us=T0 + 2 * MINUTE,
        ),
        a_view(job_id="runs", submitted_us=T0 + MINUTE, reason="preempted"),
    ]  # fmt: skip
    rows = job_rows(views, T0 + 2 * MINUTE, PRICES)
    assert rows == [
        JobRow("waits", "ada", "pending", "quota_exhausted", "dev", 2, 0, 0, True),
        JobRow("runs", "ada", "running", "", "dev", 2, 240_000, 213_333, True),
        JobRow("old", "ada", "finished", "", "dev", 2, 120_000, 106_667, False),
    ]


def test_a_configured_template_becomes_the_submission_body():
    config = JobTemplateConfig(
        name="smoke", queue="dev", project="detection", gpus=2, model=H100,
        estimated_runtime_hours=0.5, command=("python", "train.py", "--epochs", "1"),
    )  # fmt: skip
    (template,) = templates_from_json(templates_json([config]))
    assert template == Template(
        "smoke", "dev", "detection", 2, H100, 0.5, ("python", "train.py", "--epochs", "1")
    )
    assert submit_body(template, "ada") == {
        "project": "detection",
        "user": "ada",
        "queue": "dev",
        "gpus": 2,
        "command": ["python", "train.py", "--epochs", "1"],
        "estimated_runtime_s": 1800.0,
        "model": H100,
    }
    anywhere = Template("any", "dev", "detection", 1, None, 1.0, ("true",))
    assert "model" not in submit_body(anywhere, "ada")


@pytest.mark.parametrize(
    "text", [None, "", "not json", '[{"name": "x"}]', '{"name": "x"}'],
    ids=["unset", "empty", "not-json", "missing-fields", "not-a-list"],
)  # fmt: skip
def test_unreadable_templates_are_none(text):
    assert templates_from_json(text) == ()


def test_what_a_team_has_left():
    balance = {
        "team": "vision",
        "units": [
            {"unit": "gpu_ms", "granted": 100, "consumed": 30, "available_to_admit": 60},
            {"unit": "money_micros", "granted": 9, "consumed": 1, "available_to_admit": 8},
        ],
        "quotas": [{"pool": "h100", "model": H100, "nominal": 4, "in_use": 1}],
    }
    assert left_of(balance) == Left(
        (("gpu_ms", 100, 30, 60), ("money_micros", 9, 1, 8)), (("h100", H100, 4, 1),)
    )
    assert left_of({"team": "vision", "units": [], "quotas": []}) == Left((), ())


OIDC = {
    "issuer": "http://127.0.0.1:9000",
    "audience": "tally",
    "roles": [{"value": "vision", "role": "member", "team": "vision"}],
    "dashboard": {"client_id": "tally-dashboard"},
}
TEMPLATE = {"name": "smoke", "queue": "dev", "project": "detection", "command": ["true"]}


def test_the_portal_gets_the_api_url_and_templates_only_with_a_dashboard_login():
    assert portal_api.API_URL_ENV == portal_config.API_URL_ENV
    assert portal_view.TEMPLATES_ENV == portal_config.TEMPLATES_ENV
    config = parse_config(
        a_config_dict(
            auth={"oidc": OIDC},
            scheduler={"host": "10.0.0.5", "port": 8700},
            dashboard={"job_templates": [TEMPLATE]},
        )
    )
    env = portal_env(config)
    assert env[portal_config.API_URL_ENV] == "http://10.0.0.5:8700"
    (template,) = templates_from_json(env[portal_config.TEMPLATES_ENV])
    assert (template.name, template.gpus, template.estimated_runtime_hours) == ("smoke", 1, 1.0)
    assert portal_env(parse_config(a_config_dict())) == {}
