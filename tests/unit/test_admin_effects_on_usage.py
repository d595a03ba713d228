"""Admin events change how later usage is attributed: prices from their effective time on,
team definitions move a team to its cost centre."""

from __future__ import annotations

from ledger.admin import PriceSet, TeamDefined, admin_envelope, encode_admin
from ledger.events import encode_batch
from ledger.ingest import ConsumedMessage, Ingestor
from ledger.pricing import Price, PriceBook
from ledger.read.queries import LedgerQueries
from ledger.store.hot import DuckDBStore
from tests.builders import INTERVAL_US, T0_US, a_process, an_envelope, an_owner

H100 = "NVIDIA H100 80GB HBM3"


def sample_message(offset: int, step: int) -> ConsumedMessage:
    envelope = an_envelope(
        sample_time_us=T0_US + step * INTERVAL_US,
        processes=(a_process(owner=an_owner("vision", "detection")),),
    )
    return ConsumedMessage("tally.samples", 0, offset, encode_batch([envelope]))


def admin_message(offset: int, event: object) -> ConsumedMessage:
    _, value = encode_admin(admin_envelope(event))  # type: ignore[arg-type]
    return ConsumedMessage("tally.admin", 0, offset, value)


def test_a_price_set_applies_from_its_effective_time_only(tmp_path):
    change_at = T0_US + 2 * INTERVAL_US  # the end of step 2: steps 3+ start after it
    price = PriceSet(H100, None, 7_200_000, "finance", "new contract", change_at)
    with DuckDBStore(tmp_path / "l") as store:
        ingestor = Ingestor(store, "c", PriceBook((Price("*", 3_600_000),)), {})
        ingestor.apply([sample_message(0, 1), sample_message(1, 2)])
        ingestor.apply([admin_message(0, price)])
        ingestor.apply([sample_message(2, 3), sample_message(3, 4)])
        store.seal()
        restarted = Ingestor(store, "c", PriceBook((Price("*", 3_600_000),)), {})
        assert restarted.prices.rate_at(H100, "h100", change_at) == 7_200_000
    rows = LedgerQueries(tmp_path / "l").cost_by(["team"])
    # two samples at 1 micro/GPU-ms, two at 2: 10,000 GPU-ms each
    assert rows[0].money_micros == 2 * 10_000 + 2 * 20_000


def test_a_team_definition_moves_later_usage_to_its_cost_centre(tmp_path):
    team = TeamDefined("vision", "platform", ("detection",), (), "ops", "reorg", T0_US)
    with DuckDBStore(tmp_path / "l") as store:
        ingestor = Ingestor(store, "c", PriceBook((Price("*", 3_600_000),)), {"vision": "research"})
        ingestor.apply([sample_message(0, 1)])
        ingestor.apply([admin_message(0, team)])
        ingestor.apply([sample_message(1, 2)])
        store.seal()
    rows = LedgerQueries(tmp_path / "l").cost_by(["cost_centre"])
    assert {r.keys[0]: r.gpu_ms for r in rows} == {"research": 10_000, "platform": 10_000}
