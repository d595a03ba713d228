"""Roles on the admin topic: an admin event records the role it was written in, the ledger
refuses (dead letter with the reason) one whose role may not make it and applies one without a
role (the local operator's), the scheduler's price feed ignores what the ledger refuses, and
the CLI checks a `--token`'s role before it sends anything. Also the named tokens of the tokens
file, and the README's permission table, which must be the table's."""

from __future__ import annotations

import re
from dataclasses import replace

import orjson
import pytest
import yaml
from click.testing import CliRunner

from ledger.admin import (
    AdminKind,
    BudgetPolicySet,
    Cadence,
    CarryOver,
    PriceSet,
    QuotaSet,
    admin_envelope,
    admin_envelope_to_dict,
    admin_event_to_dict,
    decode_admin_message,
)
from ledger.ingest.admin import role_refusal
from ledger.pricing import PriceBook
from ledger.roles import Caller, Role, permissions_markdown
from ledger.store.side_files import load_admin_log
from ledger.units import Unit
from scheduler.price_feed import PriceFeed
from tally.cli import cli
from tally.config import ConfigError, parse_config
from tally.scheduling import load_tokens
from tests.builders import a_config_dict
from tests.conftest import REPO, write_config
from tests.unit.test_admin import EVENTS, META, admin_message, ingestor, store  # noqa: F401
from tests.unit.test_requests import STEPS

POLICY = BudgetPolicySet(
    "vision", Unit.MONEY, 10, Cadence.MONTH, None, None, CarryOver.NONE, None, *META
)
SENT = {  # one of each kind the topic takes
    **EVENTS,
    "budget-policy-set": POLICY,
    **{
        f"request-{step}": replace(STEPS[name], role=None)
        for step, name in (
            ("opened", "opened-budget"),
            ("approved", "approved"),
            ("rejected", "rejected"),
            ("expired", "expired"),
        )
    },
}
# Which roles may write each admin event, written out independently of `ledger.roles`.
MAY_WRITE: dict[str, set[Role]] = {
    "budget-granted": {Role.ADMIN, Role.FINANCE},
    "budget-granted-checked": {Role.ADMIN, Role.FINANCE},
    "budget-policy-set": {Role.ADMIN, Role.FINANCE},
    "price-set": {Role.ADMIN, Role.FINANCE},
    "price-set-any-pool": {Role.ADMIN, Role.FINANCE},
    "team-defined": {Role.ADMIN},
    "quota-set": {Role.ADMIN},
    "adjustment": {Role.ADMIN, Role.FINANCE},
    "reversal": {Role.ADMIN, Role.FINANCE},
    "period-closed": {Role.ADMIN, Role.FINANCE},
    "gpu-cordoned": {Role.ADMIN, Role.OPERATOR},
    "gpu-uncordoned": {Role.ADMIN, Role.OPERATOR},
    "request-opened": {Role.ADMIN, Role.TEAM_LEAD, Role.MEMBER},
    "request-approved": {Role.ADMIN, Role.FINANCE, Role.OPERATOR},
    "request-rejected": {Role.ADMIN, Role.FINANCE, Role.OPERATOR},
    "request-expired": {Role.ADMIN, Role.FINANCE, Role.OPERATOR},
}
ADMIN_CASES = [
    pytest.param(name, role, role in MAY_WRITE[name], id=f"{role}-{name}")
    for name in SENT
    for role in Role
]


@pytest.mark.parametrize(("name", "role", "allowed"), ADMIN_CASES)
def test_an_admin_event_is_refused_when_its_role_may_not_make_it(name, role, allowed):
    envelope = admin_envelope(replace(SENT[name], role=role))
    (decoded,), dead = decode_admin_message(orjson.dumps(admin_envelope_to_dict(envelope)))
    assert dead == [] and decoded == envelope and decoded.data.role is role
    problem = role_refusal(decoded)
    assert (problem is None) == allowed, problem
    if not allowed:
        assert problem is not None and problem.startswith(f"role {role} may not ")
    assert role_refusal(admin_envelope(SENT[name])) is None  # no role: the local operator


def test_every_kind_sent_on_the_topic_is_in_the_matrix():
    assert set(SENT) == set(MAY_WRITE)
    sent = {event.KIND for event in SENT.values()}
    # the ledger's own: allowance records (never sent) and the shards' watermark (the global
    # shard's owner sends it without a role; the fold refuses one with a role)
    assert sent == set(AdminKind) - {
        AdminKind.BUDGET_ALLOWANCE_GRANTED,
        AdminKind.SHARDS_SEALED_THROUGH,
    }


@pytest.mark.parametrize("name", list(SENT))
def test_an_event_without_a_role_encodes_and_is_identified_as_before(name):
    event = SENT[name]
    assert "role" not in admin_event_to_dict(event)
    stamped = replace(event, role=Role.ADMIN)
    assert admin_event_to_dict(stamped)["role"] == "admin"
    assert admin_envelope(stamped).id != admin_envelope(event).id


def test_an_unknown_role_is_a_dead_letter():
    data = admin_envelope_to_dict(admin_envelope(replace(EVENTS["quota-set"], role=Role.ADMIN)))
    data["data"]["role"] = "superuser"
    decoded, dead = decode_admin_message(orjson.dumps(data))
    assert decoded == [] and "data.role: expected one of admin" in dead[0].reason


def test_the_ledger_dead_letters_a_forbidden_role_and_applies_the_rest(store):  # noqa: F811
    quota = EVENTS["quota-set"]
    assert isinstance(quota, QuotaSet)
    by_finance = replace(quota, role=Role.FINANCE)
    price = replace(EVENTS["price-set"], role=Role.FINANCE)
    local = replace(quota, nominal_gpus=3)  # no role: the local operator
    result = ingestor(store).apply([admin_message(0, by_finance, price, local)])
    assert [d.reason for d in result.dead_letters] == [
        "role finance may not quota.set (allowed: admin)"
    ]
    store.seal()
    applied = load_admin_log(store.data_dir / "segments")
    assert [e.envelope.id for e in applied] == [admin_envelope(e).id for e in (price, local)]
    roles = {r.entry.event_id: r.entry.role for r in store.audit_records()}
    assert roles == {admin_envelope(price).id: "finance", admin_envelope(local).id: "admin"}


def test_the_price_feed_ignores_a_price_the_ledger_refuses():
    feed = PriceFeed(PriceBook(()))
    viewer = PriceSet("H100", None, 9_000_000, *META, role=Role.VIEWER)
    value = orjson.dumps([admin_envelope_to_dict(admin_envelope(viewer))])
    assert feed.on_admin(value) is False
    finance = replace(viewer, role=Role.FINANCE)
    assert feed.on_admin(orjson.dumps([admin_envelope_to_dict(admin_envelope(finance))]))


# ---------------------------------------------------------------------------- tokens and CLI

TOKENS_FILE = {
    "admin": "file-admin-0123456789",
    "teams": {"vision": "file-vision-0123456789"},
    "tokens": [
        {"name": "books", "token": "file-finance-0123456789", "role": "finance"},
        {"name": "ada", "token": "file-ada-0123456789", "role": "member", "team": "vision",
         "user": "ada"},
    ],
}  # fmt: skip


@pytest.fixture
def config_path(tmp_path):
    (tmp_path / "tokens.yaml").write_text(yaml.safe_dump(TOKENS_FILE))
    data = a_config_dict(scheduler={"tokens": {"file": "tokens.yaml", "admin_env": None}})
    return write_config(tmp_path / "tally.yaml", data)


def test_the_tokens_file_names_a_role_per_token(config_path):
    config = parse_config(yaml.safe_load(config_path.read_text()), "t", config_path.parent)
    tokens = load_tokens(config, {})
    assert tokens.principal("file-admin-0123456789") == Caller(Role.ADMIN)
    assert tokens.principal("file-vision-0123456789") == Caller(Role.TEAM_LEAD, "vision")
    assert tokens.principal("file-finance-0123456789") == Caller(Role.FINANCE, label="books")
    ada = tokens.principal("file-ada-0123456789")
    assert ada == Caller(Role.MEMBER, "vision", "ada", "ada") and ada.name == "member:ada"


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"role": "root"}, "role: one of admin"),
        ({"role": "member", "team": "vision"}, "role member needs a user"),
        ({"role": "team-lead"}, "role team-lead needs a team"),
        ({"role": "finance", "team": "vision"}, "organisation-wide: no team"),
        ({"role": "team-lead", "team": "ghosts"}, "unknown team(s) ghosts"),
        ({"role": "viewer", "colour": "red"}, "expected a mapping of"),
    ],
    ids=["unknown-role", "member-without-user", "lead-without-team", "finance-with-team",
         "unknown-team", "unknown-field"],
)  # fmt: skip
def test_a_bad_named_token_is_refused_with_its_place(tmp_path, entry, message):
    content = {"tokens": [{"name": "x", "token": "x-token-0123456789", **entry}]}
    (tmp_path / "tokens.yaml").write_text(yaml.safe_dump(content))
    data = a_config_dict(scheduler={"tokens": {"file": "tokens.yaml", "admin_env": None}})
    config = parse_config(data, "t", tmp_path)
    with pytest.raises(ConfigError) as raised:
        load_tokens(config, {})
    assert message in str(raised.value)


ADJUST = ("ledger", "adjust", "--account", "consumer:vision/detection", "--amount", "5",
          "--unit", "money", "--period", "2026-11", "--reason", "fix")  # fmt: skip


@pytest.mark.parametrize(
    ("token", "code", "text"),
    [
        ("file-ada-0123456789", 2, "refused for member:ada: role member may not ledger.adjust"),
        ("file-vision-0123456789", 2, "refused for team:vision"),
        ("not-a-token-0123456789", 2, "not one of the configured tokens"),
        ("file-finance-0123456789", 4, "no ledger"),  # allowed: on to the next check
    ],
    ids=["member-refused", "team-lead-refused", "unknown-token", "finance-allowed"],
)
def test_the_cli_checks_a_tokens_role_before_sending_an_admin_event(
    config_path, tmp_path, token, code, text
):
    args = [*ADJUST, "--config", str(config_path), "--data-dir", str(tmp_path / "none")]
    result = CliRunner().invoke(cli, args, env={"TALLY_TOKEN": token})
    assert result.exit_code == code, result.output
    assert text in result.output
    assert not re.search(r"^sent ", result.output, re.MULTILINE)


# ---------------------------------------------------------------------------- the README


def test_the_readme_permission_table_is_the_tables():
    readme = (REPO / "README.md").read_text()
    found = re.search(
        r"<!-- permissions:begin.*?-->\n(.*?)<!-- permissions:end -->", readme, re.DOTALL
    )
    assert found, "README.md has no permission table between its markers"
    assert found.group(1) == permissions_markdown(), (
        "README.md's permission table differs from ledger.roles; paste permissions_markdown()"
    )
