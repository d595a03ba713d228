"""What each shard role keeps of each route's fold (`ledger.ingest.shards.kept_by`), as a table
of role × route over one fold per route; and the ingestor's refusals: a samples shard takes no
inventory reports and the global shard no samples (raised before anything commits); every
shard takes every budget policy (the global shard's jobs clock grants only those that do not
depend on spending, `ledger.ingest.sealed`)."""

from __future__ import annotations

from dataclasses import replace

import orjson
import pytest

from ledger.admin import (
    BudgetPolicySet,
    Cadence,
    CarryOver,
    PeriodClosed,
    admin_envelope,
    admin_envelope_to_dict,
)
from ledger.admin.view import AppliedAdmin
from ledger.audit import AuditEntry
from ledger.events import DeadLetter, Owner, encode_batch
from ledger.fleet_alerts import FleetKind, HealthAlert
from ledger.holds import OpenHold
from ledger.ingest import ConsumedMessage, Ingestor, InputTopics, OutputTopics
from ledger.ingest.batch import Folded
from ledger.ingest.sealed import without_spending
from ledger.ingest.shards import Route, ShardRole, ShardRoleError, kept_by
from ledger.postings import Posting, Transaction, TransactionKind
from ledger.pricing import Price, PriceBook
from ledger.store.memory import MemoryStore
from ledger.store.port import SourcedTransaction, StateChanges
from ledger.units import Unit
from tests.builders import T0_US, an_envelope
from tests.inventory_builders import a_record

K = TransactionKind


def txn(txn_id: str, kind: TransactionKind) -> SourcedTransaction:
    postings = (Posting("budget:vision", Unit.MONEY, 1), Posting("funding:vision", Unit.MONEY, -1))
    made = Transaction(txn_id, kind, 0, 1, "", "", "", "", postings, ("cause",), "2026-11")
    return SourcedTransaction(made, "topic", 0, 0)


LETTER = DeadLetter(reason="bad", payload="x", event_id="e", topic="topic", partition=0, offset=0)
AUDIT = AuditEntry("e", 0, "kind", "alice", "admin", "cli", "subject")
HOLD = OpenHold("job-1", Unit.MONEY, "vision", None, 5, 10, "placed")
ENTRY = AppliedAdmin(admin_envelope(PeriodClosed("2026-11", "alice", "close", T0_US)))
ALERT = HealthAlert(FleetKind.TEAM_IDLE, "GPU-0", "node", "pool", "model", "unhealthy", "x", 0, 1)

# a jobs fold: a placement, a late owner's correction (reversal, re-posting), its settlement and
# a release (derived from index 3 on)
JOBS_FOLD = Folded(
    transactions=(
        txn("place", K.HOLD),
        txn("correct", K.REVERSAL),
        txn("repost", K.USAGE),
        txn("settle", K.HOLD_SETTLE),
        txn("expire", K.HOLD_RELEASE),
    ),
    dead=(LETTER,),
    changes=StateChanges(
        holds=(HOLD,),
        reversals=(("suspense", "correct"),),
        seen=(("release", 1, "job:job-1"),),
        timelines={"GPU-0": ()},
        audit=(AUDIT,),
        job_owners={"job-7": Owner("vision", None, None, "job-7")},
        awaiting=(("job-8", "repost", 1),),
        resolved=("suspense",),
    ),
    derived_from=3,
)
# an admin fold: a grant, an adjustment, reversals of a usage transaction the ledger holds, of
# the batch's adjustment and of that reversal (nothing derived)
ADMIN_FOLD = Folded(
    transactions=(
        txn("grant", K.BUDGET_GRANT),
        txn("adjust", K.ADJUSTMENT),
        txn("undo-usage", K.REVERSAL),
        txn("undo-adjust", K.REVERSAL),
        txn("undo-undo", K.REVERSAL),
    ),
    dead=(LETTER,),
    changes=StateChanges(
        admin=(ENTRY,),
        reversals=(
            ("usage", "undo-usage"),
            ("adjust", "undo-adjust"),
            ("undo-adjust", "undo-undo"),
        ),
        audit=(AUDIT,),
        inventory={"GPU-0": a_record("GPU-0")},
    ),
    derived_from=5,
    fleet_alerts=(ALERT,),
)
SAMPLES_FOLD = Folded(transactions=(txn("usage", K.USAGE),), dead=(LETTER,), duplicates=2)
INVENTORY_FOLD = Folded(
    changes=StateChanges(inventory={"GPU-0": a_record("GPU-0")}), fleet_alerts=(ALERT,)
)
FOLDS = {
    Route.ADMIN: ADMIN_FOLD,
    Route.JOBS: JOBS_FOLD,
    Route.INVENTORY: INVENTORY_FOLD,
    Route.SAMPLES: SAMPLES_FOLD,
}
SAMPLES_OF_JOBS = replace(
    JOBS_FOLD,
    transactions=JOBS_FOLD.transactions[1:3],
    dead=(),
    changes=replace(JOBS_FOLD.changes, holds=(), audit=()),
    derived_from=2,
)
SAMPLES_OF_ADMIN = replace(
    ADMIN_FOLD,
    transactions=(ADMIN_FOLD.transactions[2],),
    dead=(),
    changes=StateChanges(admin=(ENTRY,), reversals=[("usage", "undo-usage")]),
    derived_from=1,
    fleet_alerts=(),
)
AS_FOLDED = "as folded"
REFUSED = "refused"
TABLE: dict[tuple[ShardRole, Route], Folded | str] = {
    (ShardRole.WHOLE, Route.ADMIN): AS_FOLDED,
    (ShardRole.WHOLE, Route.JOBS): AS_FOLDED,
    (ShardRole.WHOLE, Route.INVENTORY): AS_FOLDED,
    (ShardRole.WHOLE, Route.SAMPLES): AS_FOLDED,
    (ShardRole.GLOBAL, Route.ADMIN): AS_FOLDED,
    (ShardRole.GLOBAL, Route.JOBS): AS_FOLDED,
    (ShardRole.GLOBAL, Route.INVENTORY): AS_FOLDED,
    (ShardRole.GLOBAL, Route.SAMPLES): REFUSED,
    (ShardRole.SAMPLES, Route.ADMIN): SAMPLES_OF_ADMIN,
    (ShardRole.SAMPLES, Route.JOBS): SAMPLES_OF_JOBS,
    (ShardRole.SAMPLES, Route.INVENTORY): REFUSED,
    (ShardRole.SAMPLES, Route.SAMPLES): AS_FOLDED,
}


@pytest.mark.parametrize(
    ("role", "route", "expected"),
    [(role, route, expected) for (role, route), expected in TABLE.items()],
    ids=[f"{role}-shard-of-{route}" for role, route in TABLE],
)
def test_what_a_shard_keeps_of_a_fold(
    role: ShardRole, route: Route, expected: Folded | str
) -> None:
    folded = FOLDS[route]
    if expected == REFUSED:
        with pytest.raises(ShardRoleError, match="takes no"):
            kept_by(role, route, folded)
        return
    kept = kept_by(role, route, folded)
    assert kept == (folded if expected == AS_FOLDED else expected)


PRICES = PriceBook((Price("*", 3_600_000),))
INPUTS = InputTopics("admin", "jobs", "inventory")


def an_ingestor(store: MemoryStore, role: ShardRole) -> Ingestor:
    topics = OutputTopics("alerts", "dl", "balances")
    return Ingestor(store, "c", PRICES, {}, topics=topics, inputs=INPUTS, role=role)


def admin_message(offset: int, *events: object) -> ConsumedMessage:
    value = orjson.dumps([admin_envelope_to_dict(admin_envelope(e)) for e in events])  # type: ignore[arg-type]
    return ConsumedMessage("admin", 0, offset, value)


REFUSED_TOPICS = {
    "samples-shard-takes-no-inventory": (
        ShardRole.SAMPLES,
        ConsumedMessage("inventory", 0, 0, b"{}"),
    ),
    "global-shard-takes-no-samples": (
        ShardRole.GLOBAL,
        ConsumedMessage("samples", 3, 0, encode_batch([an_envelope()])),
    ),
}


@pytest.mark.parametrize(("role", "message"), REFUSED_TOPICS.values(), ids=REFUSED_TOPICS.keys())
def test_a_shard_refuses_a_topic_it_does_not_fold_before_committing_anything(
    role: ShardRole, message: ConsumedMessage
) -> None:
    store = MemoryStore()
    ingest = an_ingestor(store, role)
    close = admin_message(0, PeriodClosed("2026-10", "alice", "close", T0_US))
    with pytest.raises(ShardRoleError, match=message.topic):
        ingest.apply([close, message])
    assert store.applied_offsets("c") == {}
    assert store.admin_entries() == []


def policy(every: Cadence, carry: CarryOver) -> BudgetPolicySet:
    limit = 50 if carry is CarryOver.PERCENT else None
    return BudgetPolicySet(
        "vision", Unit.MONEY, 1_000, every, None, None, carry, limit, "alice", "budget", T0_US
    )


POLICIES = {
    "monthly-without-carry-over": (policy(Cadence.MONTH, CarryOver.NONE), False),
    "monthly-carrying-all": (policy(Cadence.MONTH, CarryOver.ALL), True),
    "monthly-carrying-a-percentage": (policy(Cadence.MONTH, CarryOver.PERCENT), True),
    "quarterly-without-carry-over": (policy(Cadence.QUARTER, CarryOver.NONE), True),
}


@pytest.mark.parametrize(("event", "spends"), POLICIES.values(), ids=POLICIES.keys())
@pytest.mark.parametrize("role", list(ShardRole), ids=[f"{r}-shard" for r in ShardRole])
def test_every_shard_takes_every_budget_policy(
    role: ShardRole, event: BudgetPolicySet, spends: bool
) -> None:
    """A global shard grants a policy that spends from the shards' watermark
    (`ledger.ingest.sealed`), so it refuses none."""
    store = MemoryStore()
    result = an_ingestor(store, role).apply([admin_message(0, event)])
    assert [d.reason for d in result.dead_letters] == []
    assert len(store.admin_view().policies) == 1
    kept = without_spending(store.admin_view()).policies.keys()
    assert kept == (set() if spends else {("vision", Unit.MONEY)})
