"""Admin events: the strict codec, and their effects on a real DuckDB/Parquet ledger."""

from __future__ import annotations

from dataclasses import replace

import orjson
import pytest

from ledger.admin import (
    AdjustmentRecorded,
    AdminView,
    BudgetGranted,
    GpuCordoned,
    GpuUncordoned,
    PeriodClosed,
    PriceSet,
    QuotaSet,
    TeamDefined,
    admin_envelope,
    admin_envelope_to_dict,
    decode_admin_message,
    encode_admin,
)
from ledger.events import encode_batch
from ledger.ingest import ConsumedMessage, Ingestor, InputTopics, OutputTopics
from ledger.pricing import EnergyPrice, Price, PriceBook
from ledger.read.queries import LedgerQueries
from ledger.store.hot import DuckDBStore
from ledger.store.side_files import load_admin_log
from ledger.store.verify import verify_ledger
from ledger.units import Unit
from tests.builders import INTERVAL_US, T0_US, a_process, an_envelope, an_owner

DAY_US = 86_400_000_000
WHEN = T0_US + 5 * DAY_US  # 2026-11-06
PRICES = PriceBook((Price("*", 3_600_000),))  # one micro-unit per GPU-ms
META = ("alice", "test", WHEN)

GRANT = BudgetGranted("vision", "2026-11", Unit.MONEY, 1_000_000_000, *META)
EVENTS = {
    "budget-granted": GRANT,
    "budget-granted-checked": replace(GRANT, unit=Unit.GPU_MS, amount=-5, expected_total=10),
    "price-set": PriceSet("H100", "h100", 3_200_000, *META),
    "price-set-any-pool": PriceSet("A100", None, 1_800_000, *META),
    "team-defined": TeamDefined("vision", "research", ("detection",), ("ada",), *META),
    "quota-set": QuotaSet("vision", "h100", "H100", 8, 4, None, *META),
    "adjustment": AdjustmentRecorded(
        "consumer:vision/detection", Unit.MONEY, -2_500_000, "2026-11", *META, user="ada"
    ),
    "reversal": AdjustmentRecorded.reversal("some-txn", *META),
    "period-closed": PeriodClosed("2026-10", *META),
    "gpu-cordoned": GpuCordoned("node-01", *META),
    "gpu-uncordoned": GpuUncordoned("GPU-0", *META),
}


def admin_message(offset, *events, partition=0):
    value = orjson.dumps([admin_envelope_to_dict(admin_envelope(e)) for e in events])
    return ConsumedMessage("admin", partition, offset, value)


def sample_message(offset, *minutes, job="job-1", topic="samples"):
    envelopes = [
        an_envelope(
            sample_time_us=T0_US + m * INTERVAL_US,
            processes=(a_process(owner=an_owner("vision", "detection", "ada", job)),),
        )
        for m in minutes
    ]
    return ConsumedMessage(topic, 0, offset, encode_batch(envelopes))


def ingestor(store):
    return Ingestor(
        store,
        "c",
        PRICES,
        {"vision": "research"},
        topics=OutputTopics("alerts", "dl", "balances"),
        inputs=InputTopics("admin", "jobs"),
    )


def postings_of(store, txn_id):
    rows = LedgerQueries(store.data_dir)._query(
        'SELECT account, unit, amount, team, project, "user", cost_centre, kind, period, cause '
        "FROM {postings} WHERE txn_id = ? ORDER BY leg",
        [txn_id],
    )
    return [tuple(r) for r in rows]


@pytest.fixture
def store(tmp_path):
    with DuckDBStore(tmp_path / "ledger") as s:
        yield s


# ---------------------------------------------------------------------------- codec


@pytest.mark.parametrize("event", list(EVENTS.values()), ids=list(EVENTS))
def test_every_admin_event_survives_the_wire(event):
    envelope = admin_envelope(event)
    key, value = encode_admin(envelope)
    decoded, dead = decode_admin_message(value)
    assert dead == []
    assert decoded == [envelope]
    assert key == event.entity.encode()


def test_ids_are_derived_from_content():
    assert admin_envelope(GRANT).id == admin_envelope(replace(GRANT)).id
    for changed in (
        replace(GRANT, reason="other"),
        replace(GRANT, amount=2),
        replace(GRANT, effective_us=WHEN + 1),
    ):
        assert admin_envelope(changed).id != admin_envelope(GRANT).id


def _grant_json(**data_changes):
    doc = admin_envelope_to_dict(admin_envelope(GRANT))
    doc["data"].update(data_changes)
    return orjson.dumps(doc)


def _adjust_json(**data_changes):
    doc = admin_envelope_to_dict(admin_envelope(EVENTS["adjustment"]))
    doc["data"].update(data_changes)
    return orjson.dumps(doc)


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        pytest.param(b"", "empty message", id="empty"),
        pytest.param(b"{nope", "not JSON", id="not-json"),
        pytest.param(b"[]", "empty batch", id="empty-batch"),
        pytest.param(b'{"type": "tally.admin.coup"}', "unknown admin event type", id="type"),
        pytest.param(_grant_json(amount=1.5), "expected an integer, got float", id="float"),
        pytest.param(_grant_json(amount=True), "expected an integer, got bool", id="bool"),
        pytest.param(_grant_json(amount="7"), "expected an integer, got str", id="string-int"),
        pytest.param(_grant_json(amount=1e23), "expected an integer", id="huge-float"),
        pytest.param(_grant_json(unit="dollars"), "unknown unit", id="unit"),
        pytest.param(_grant_json(unit="energy_mj"), "budgets are in", id="budget-unit"),
        pytest.param(_grant_json(amount=0), "a grant of zero", id="zero-grant"),
        pytest.param(_grant_json(period="2026-13"), "not a month", id="period"),
        pytest.param(_grant_json(team="a/b"), "expected a name", id="team-name"),
        pytest.param(_grant_json(colour="red"), "unknown fields", id="unknown-field"),
        pytest.param(_grant_json(reason=""), "reason: expected a non-empty", id="no-reason"),
        pytest.param(
            orjson.dumps(
                {
                    k: v
                    for k, v in admin_envelope_to_dict(admin_envelope(GRANT)).items()
                    if k != "id"
                }
            ),
            "id: does not match",
            id="no-id",
        ),
        pytest.param(
            _adjust_json(account="budget:vision"), "not adjusted by hand", id="adjust-budget"
        ),
        pytest.param(_adjust_json(account="nowhere:x"), "known kind", id="adjust-unknown-account"),
        pytest.param(
            _adjust_json(reverses_txn="t1"), "a reversal names only", id="reversal-with-amount"
        ),
        pytest.param(_adjust_json(period=None), "period: an adjustment needs", id="no-period"),
    ],
)
def test_bad_admin_input_becomes_a_dead_letter(raw, reason):
    envelopes, dead = decode_admin_message(raw)
    assert envelopes == []
    assert len(dead) == 1
    assert reason in dead[0].reason


def test_one_bad_item_does_not_spoil_its_batch():
    good = admin_envelope_to_dict(admin_envelope(GRANT))
    envelopes, dead = decode_admin_message(orjson.dumps([good, {"type": 3}]))
    assert [e.id for e in envelopes] == [good["id"]]
    assert len(dead) == 1


# ---------------------------------------------------------------------------- effects


def test_a_grant_credits_the_budget_against_the_cost_centres_funding(store):
    result = ingestor(store).apply([admin_message(0, GRANT)])
    assert (result.admin_events, result.commit.transactions) == (1, 1)
    store.seal()
    assert postings_of(store, admin_envelope(GRANT).id) == [
        ("budget:vision", "money_micros", -1_000_000_000, "vision", None, None, "research")
        + ("budget_grant", "2026-11", admin_envelope(GRANT).id),
        ("funding:research", "money_micros", 1_000_000_000, "vision", None, None, "research")
        + ("budget_grant", "2026-11", admin_envelope(GRANT).id),
    ]
    assert store.budget_total("vision", "2026-11", Unit.MONEY) == 1_000_000_000
    assert verify_ledger(store.data_dir).ok


def test_an_adjustment_posts_against_the_adjustments_account(store):
    adjustment = EVENTS["adjustment"]
    ingestor(store).apply([admin_message(0, adjustment)])
    store.seal()
    eid = admin_envelope(adjustment).id
    assert postings_of(store, eid) == [
        ("consumer:vision/detection", "money_micros", -2_500_000, "vision", "detection", "ada")
        + ("research", "adjustment", "2026-11", eid),
        ("adjustments:manual", "money_micros", 2_500_000, "vision", "detection", "ada")
        + ("research", "adjustment", "2026-11", eid),
    ]


def test_a_reversal_is_the_exact_negation_linked_by_cause(store):
    ing = ingestor(store)
    ing.apply([sample_message(0, 1)])
    usage_id = an_envelope(
        sample_time_us=T0_US + INTERVAL_US,
        processes=(a_process(owner=an_owner("vision", "detection", "ada", "job-1")),),
    ).id
    reversal = AdjustmentRecorded.reversal(usage_id, "alice", "double-counted", WHEN)
    result = ing.apply([admin_message(0, reversal)])
    assert result.commit.transactions == 1
    store.seal()
    original = postings_of(store, usage_id)
    reversed_rows = postings_of(store, admin_envelope(reversal).id)
    assert [r[:7] for r in reversed_rows] == [(*r[:2], -r[2], *r[3:7]) for r in original]
    assert {r[7] for r in reversed_rows} == {"reversal"}
    assert {r[9] for r in reversed_rows} == {f"{admin_envelope(reversal).id} {usage_id}"}
    net = LedgerQueries(store.data_dir).balances()
    assert net[("consumer:vision/detection", "gpu_ms")] == 0
    assert net[("capacity:h100/NVIDIA H100 80GB HBM3", "money_micros")] == 0
    assert verify_ledger(store.data_dir).ok


def _refused_cases():
    other = replace(GRANT, reason="again", expected_total=0)
    return [
        pytest.param(
            [AdjustmentRecorded.reversal("no-such-txn", *META)],
            "no transaction no-such-txn to reverse",
            id="reverse-unknown",
        ),
        pytest.param(
            [GRANT, AdjustmentRecorded.reversal(admin_envelope(GRANT).id, *META)],
            "a budget_grant transaction is not reversed by hand",
            id="reverse-a-grant",
        ),
        pytest.param(
            [
                EVENTS["adjustment"],
                AdjustmentRecorded.reversal(admin_envelope(EVENTS["adjustment"]).id, *META),
                AdjustmentRecorded.reversal(
                    admin_envelope(EVENTS["adjustment"]).id, "bob", "again", WHEN
                ),
            ],
            f"transaction {admin_envelope(EVENTS['adjustment']).id} is already reversed",
            id="reverse-twice",
        ),
        pytest.param(
            [GRANT, other],
            "stale grant: computed against a total of 0 money_micros, the ledger has 1000000000",
            id="stale-grant",
        ),
    ]


@pytest.mark.parametrize(("events", "reason"), _refused_cases())
def test_refused_admin_events_are_dead_letters_and_post_nothing(store, events, reason):
    result = ingestor(store).apply([admin_message(0, *events)])
    assert [d.reason for d in result.dead_letters] == [reason]
    assert result.commit.transactions == len(events) - 1
    assert "dl" in {m.topic for m in store.pending_outbox()}
    store.seal()
    assert verify_ledger(store.data_dir).ok


def test_admin_events_apply_exactly_once(store):
    ing = ingestor(store)
    first = ing.apply([admin_message(0, GRANT, EVENTS["adjustment"])])
    assert first.commit.transactions == 2
    redelivered = ing.apply([admin_message(0, GRANT, EVENTS["adjustment"])])
    assert redelivered.skipped_messages == 1
    resent = ingestor(store).apply([admin_message(1, GRANT), admin_message(0, GRANT, partition=1)])
    assert (resent.commit.transactions, resent.commit.duplicates) == (0, 2)
    store.seal()
    assert LedgerQueries(store.data_dir).transaction_count() == 2
    assert store.budget_total("vision", "2026-11", Unit.MONEY) == 1_000_000_000


def test_prices_teams_and_quotas_are_recorded_in_the_admin_log(store):
    later = PriceSet("H100", None, 4_000_000, "alice", "raise", WHEN + DAY_US)
    team = EVENTS["team-defined"]
    ingestor(store).apply(
        [
            admin_message(
                0, EVENTS["price-set"], later, team, EVENTS["quota-set"], replace(team, reason="2")
            )
        ]
    )
    outcomes = [(e.envelope.type.value.rsplit(".", 1)[1], e.outcome) for e in store.admin_entries()]
    assert outcomes == [
        ("price_set", "applied"),
        ("price_set", "applied"),
        ("team_defined", "applied"),
        ("quota_set", "applied"),
        ("team_defined", "unchanged"),
    ]
    book = store.price_book(PriceBook((Price("*", 1_000_000),), (EnergyPrice(150_000),)))
    assert book.energy_rate_at("h100", WHEN) == 150_000  # the config's energy prices are kept
    assert book.rate_at("H100", "h100", WHEN) == 3_200_000
    assert book.rate_at("H100", "a100", WHEN) == 1_000_000  # the H100 price of every pool …
    assert book.rate_at("H100", "a100", WHEN + DAY_US) == 4_000_000  # … from its effective time
    assert book.rate_at("A100", "a100", WHEN + DAY_US) == 1_000_000
    store.seal()
    view = AdminView.from_log(load_admin_log(store.segments_root))  # the readers' copy
    assert view.teams == {"vision": team}
    assert list(view.quotas.values()) == [EVENTS["quota-set"]]
    assert view.prices == (EVENTS["price-set"], later)
