"""The inventory route's fold: collectors' node reports and GPU health events → the GPU
records they change,.

Pure: the decoded events (each with the message it came from) and the view's inventory in,
a `Folded` out: `StateChanges.inventory` and the health alerts the changes raise or resolve
(`ledger.inventory.alerts`). No postings, no
dedupe ids: a report or health event folded twice changes nothing the second time
(`ledger.inventory.fold_inventory`), so a redelivered or resent one is harmless without them.
The ingestor publishes each changed record on the `inventory` topic and each alert on the
alerts topic through the outbox, in the same commit: exactly once.
"""

from __future__ import annotations

from collections.abc import Sequence

from ledger.ingest.batch import Folded
from ledger.inventory import fold_inventory as fold_records
from ledger.inventory.alerts import health_alerts
from ledger.inventory.health_events import InventoryEvent
from ledger.store.port import ConsumedMessage, LedgerView, StateChanges, ViewKeys

INVENTORY_KEYS = ViewKeys(inventory=True, admin=True)  # admin: the standing cordons


def fold_inventory(
    decoded: Sequence[tuple[InventoryEvent, ConsumedMessage]], view: LedgerView
) -> Folded:
    """The records the batch's events change, in the batch's order."""
    cordons = {t: (c.actor, c.reason) for t, c in view.admin.cordons.items()}
    events = [envelope.data for envelope, _ in decoded]
    changed = fold_records(events, view.inventory, cordons=cordons)
    alerts = health_alerts(view.inventory, changed)
    return Folded(changes=StateChanges(inventory=changed), fleet_alerts=alerts)
