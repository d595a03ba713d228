"""The scheduler's prices: the configuration's plus the price changes applied through the
`admin` topic, folded as the ledger folds them."""

import orjson
import pytest

from ledger.admin.codec import admin_envelope, encode_admin
from ledger.admin.events import PeriodClosed, PriceSet
from ledger.pricing import Price, PriceBook
from scheduler.price_feed import PriceFeed
from tests.scheduler_builders import T0_US

CONFIG = PriceBook((Price("A100", 1_800_000), Price("H100", 3_200_000)))
LATER = T0_US + 3_600_000_000


def _price(model: str, micros: int, at_us: int = T0_US, pool: str | None = None) -> bytes:
    event = PriceSet(model, pool, micros, "admin", "new contract", at_us)
    return encode_admin(admin_envelope(event))[1]


@pytest.mark.parametrize(
    ("messages", "changed", "h100_now", "h100_later"),
    [
        pytest.param([], False, 3_200_000, 3_200_000, id="config-prices-alone"),
        pytest.param([_price("H100", 1_000_000)], True, 1_000_000, 1_000_000, id="price-cut"),
        pytest.param(
            [_price("H100", 1_000_000, LATER)], True, 3_200_000, 1_000_000, id="effective-later"
        ),
        pytest.param(
            [_price("H100", 1_000_000), _price("H100", 1_000_000)],
            True,
            1_000_000,
            1_000_000,
            id="resend-counted-once",
        ),
        pytest.param(
            [_price("H100", 900_000, pool="spot")], True, 3_200_000, 3_200_000, id="other-pool"
        ),
        pytest.param(
            [
                encode_admin(admin_envelope(PeriodClosed("2026-10", "admin", "close", T0_US)))[1],
                b"not json",
                None,
                orjson.dumps({"type": "tally.admin.price_set"}),
            ],
            False,
            3_200_000,
            3_200_000,
            id="other-events-and-garbage-passed-over",
        ),
    ],
)
def test_price_changes_from_the_admin_topic(
    messages: list[bytes | None], changed: bool, h100_now: int, h100_later: int
) -> None:
    feed = PriceFeed(CONFIG)
    got = [feed.on_admin(m) for m in messages]
    assert any(got) is changed
    if len(messages) == 2 and messages[0] == messages[1]:
        assert got == [True, False]
    assert feed.book.rate_at("H100", "main", T0_US) == h100_now
    assert feed.book.rate_at("H100", "main", LATER) == h100_later
    assert feed.book.rate_at("A100", "main", T0_US) == 1_800_000
