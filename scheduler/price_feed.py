"""The prices the scheduler places and holds by: the configuration's price book plus every
price change applied through the `admin` topic (`PriceSet`), added up as the ledger adds them
(`AdminView.price_book`) — so "cheapest first" and a job's hold use the prices the ledger
charges.

The ledger applies every valid `PriceSet` (prices are effective-dated; none is refused), so the
scheduler folds them straight off the topic, read from its beginning. A resent event (same id)
counts once; other admin events and messages that do not decode are passed over (the ledger
dead-letters those). Pure bookkeeping: message values in, a `PriceBook` out.
"""

from __future__ import annotations

from ledger.admin.codec import decode_admin_message
from ledger.admin.events import PriceSet
from ledger.admin.view import AdminView
from ledger.pricing import PriceBook
from ledger.roles import Action, admin_event_refusal


class PriceFeed:
    """The configuration's prices (`default`) and the applied admin price changes: `book`."""

    __slots__ = ("_prices", "_seen", "book", "default")

    def __init__(self, default: PriceBook) -> None:
        self.default = default
        self.book = default
        self._prices: list[PriceSet] = []
        self._seen: set[str] = set()

    def on_admin(self, value: bytes | None) -> bool:
        """Fold one `admin` message; whether the price book changed."""
        envelopes, _ = decode_admin_message(value)
        fresh = [
            e
            for e in envelopes
            if isinstance(e.data, PriceSet)
            and e.id not in self._seen
            and admin_event_refusal(Action.PRICE_SET, e.data.role) is None  # as the ledger
        ]
        for envelope in fresh:
            assert isinstance(envelope.data, PriceSet)
            self._seen.add(envelope.id)
            self._prices.append(envelope.data)
        if fresh:
            self.book = AdminView(prices=tuple(self._prices)).price_book(self.default)
        return bool(fresh)
