"""A global shard folds the shards' watermark (`ledger.ingest.sealed`): a hold is settled once,
when it has ended (released or expired) and a `ShardsSealedThrough` past its end is folded,
by `min(the job's usage up to it, what is left)`, the rest released — whichever of the release
and the event comes first; a retried job's (same id) new hold by the usage past what its
earlier holds settled (the job's baseline); a recurring budget that carries over grants a month
only from the event, with the event's per-team spending. A whole ledger logs the event as
changing nothing; an event recording a role, or one not newer than the last, changes nothing
either."""

from __future__ import annotations

from collections import Counter

import orjson
import pytest

from ledger.admin import (
    BudgetPolicySet,
    Cadence,
    CarryOver,
    JobUsage,
    ShardsSealedThrough,
    TeamUsage,
    admin_envelope,
    admin_envelope_to_dict,
)
from ledger.holds import HoldPlaced, HoldReleased, encode_hold, hold_envelope
from ledger.ingest import ConsumedMessage, Ingestor, InputTopics, OutputTopics
from ledger.ingest.admin import SEALED_ELSEWHERE, SEALED_NOT_NEWER
from ledger.ingest.shards import ShardRole
from ledger.postings import TransactionKind
from ledger.pricing import Price, PriceBook
from ledger.roles import Role
from ledger.store.memory import MemoryStore
from ledger.units import Unit
from tests.builders import T0_US

S = 1_000_000
HOUR = 3600 * S
PLACED = HoldPlaced("job-1", "vision", None, Unit.MONEY, 1_000, T0_US + HOUR, T0_US)
RELEASED = HoldReleased("job-1", T0_US + 100 * S, "completed")


def sealed(through_us: int, used: int = 0, **changes: object) -> ShardsSealedThrough:
    jobs = (JobUsage("job-1", Unit.MONEY, used),) if used else ()
    event = ShardsSealedThrough(
        through_us, ("samples-0",), jobs, (), "ledger", "sealed", through_us
    )
    return event if not changes else ShardsSealedThrough(**{**_fields(event), **changes})  # type: ignore[arg-type]


def _fields(event: ShardsSealedThrough) -> dict[str, object]:
    return {name: getattr(event, name) for name in ShardsSealedThrough.__slots__}


class Feed:
    """One ingestor of `role` over a memory store, and each topic's next offset."""

    def __init__(self, role: ShardRole = ShardRole.GLOBAL) -> None:
        self.store = MemoryStore()
        topics = OutputTopics("alerts", "dl", "balances")
        inputs = InputTopics("admin", "jobs", "inventory")
        prices = PriceBook((Price("*", 3_600_000),))
        self.ingest = Ingestor(self.store, "c", prices, {}, topics=topics, inputs=inputs, role=role)
        self.offsets: Counter[str] = Counter()

    def send(self, event: object) -> None:
        if isinstance(event, HoldPlaced | HoldReleased):
            topic, value = "jobs", encode_hold(hold_envelope(event))[1]
        else:
            topic = "admin"
            value = orjson.dumps(admin_envelope_to_dict(admin_envelope(event)))  # type: ignore[arg-type]
        self.ingest.apply([ConsumedMessage(topic, 0, self.offsets[topic], value)])
        self.offsets[topic] += 1

    def hold_sums(self) -> dict[str, int]:
        """What was settled and released off `hold:vision`, and what is still open."""
        sums: Counter[str] = Counter()
        for row in self.store._s.booked:
            for p in row.item.txn.postings:
                if p.account == "hold:vision" and row.item.txn.kind is not TransactionKind.HOLD:
                    sums[row.item.txn.kind.value] -= p.amount
        sums["open"] = sum(h.amount for h in self.store.open_holds().values())
        return dict(+sums)


HOLD_CASES = {
    "released-watermark-before-the-release": (
        [PLACED, RELEASED, sealed(RELEASED.time_us - 1, 400)],
        {"open": 1_000},
    ),
    "released-then-watermark-past-it": (
        [PLACED, RELEASED, sealed(RELEASED.time_us, 400)],
        {"hold_settle": 400, "hold_release": 600},
    ),
    "usage-over-the-hold": (
        [PLACED, RELEASED, sealed(RELEASED.time_us, 5_000)],
        {"hold_settle": 1_000},
    ),
    "no-usage": ([PLACED, RELEASED, sealed(RELEASED.time_us)], {"hold_release": 1_000}),
    "watermark-first-then-released": (
        [PLACED, sealed(RELEASED.time_us + S, 400), RELEASED],
        {"hold_settle": 400, "hold_release": 600},
    ),
    "running-past-the-watermark": ([PLACED, sealed(RELEASED.time_us, 400)], {"open": 1_000}),
    "expired-unreleased": (
        [PLACED, sealed(PLACED.expires_us, 400)],
        {"hold_settle": 400, "hold_release": 600},
    ),
    # the jobs topic read behind the admin topic: the watermark was computed before the
    # global shard knew of the hold, so it gives no usage of the job; it waits for one that does
    "learned-after-the-watermark-waits": (
        [sealed(RELEASED.time_us + S, covers=()), PLACED, RELEASED],
        {"open": 1_000},
    ),
    "learned-after-then-a-watermark-covering-it": (
        [
            sealed(RELEASED.time_us + S, covers=()),
            PLACED,
            RELEASED,
            sealed(RELEASED.time_us + 2 * S, 400, covers=("job-1",)),
        ],
        {"hold_settle": 400, "hold_release": 600},
    ),
    "covered-with-no-usage-is-released": (
        [PLACED, RELEASED, sealed(RELEASED.time_us, covers=("job-1",))],
        {"hold_release": 1_000},
    ),
    "a-watermark-covering-other-jobs-settles-nothing": (
        [PLACED, RELEASED, sealed(RELEASED.time_us, covers=("job-2",))],
        {"open": 1_000},
    ),
    "second-watermark-settles-nothing-more": (
        [PLACED, RELEASED, sealed(RELEASED.time_us, 400), sealed(RELEASED.time_us + S, 900)],
        {"hold_settle": 400, "hold_release": 600},
    ),
}


@pytest.mark.parametrize(("events", "expected"), HOLD_CASES.values(), ids=HOLD_CASES.keys())
def test_a_global_shard_settles_a_hold_once_it_ended_before_the_watermark(
    events: list[object], expected: dict[str, int]
) -> None:
    feed = Feed()
    for event in events:
        feed.send(event)
    assert feed.hold_sums() == expected
    assert feed.store.dead_letters() == []


# A retried job keeps its id: its new hold is settled by the job's usage past what its earlier
# holds' settlements read (the baseline), as a whole ledger settles each hold by the usage
# while it is open. The usage a watermark gives is the job's, every attempt's, up to it.
RETRY = HoldPlaced("job-1", "vision", None, Unit.MONEY, 800, T0_US + 2 * HOUR, T0_US + 200 * S)
RETRY_RELEASED = HoldReleased("job-1", T0_US + 300 * S, "completed")
FIRST = [PLACED, RELEASED]
THEN_RETRY = [RETRY, RETRY_RELEASED]

# events → (settled and released off the hold, open; the job's baseline; the open hold's
# (amount, baseline, earlier), None: none open)
RETRY_CASES: dict[str, tuple[list[object], dict[str, int], int, tuple[int, int, int] | None]] = {
    "first-attempt-sets-the-baseline": (
        [*FIRST, sealed(RELEASED.time_us, 400)],
        {"hold_settle": 400, "hold_release": 600},
        400,
        None,
    ),
    "retry-after-the-first-settled-usage-under": (
        [*FIRST, sealed(RELEASED.time_us, 400), *THEN_RETRY, sealed(RETRY_RELEASED.time_us, 700)],
        {"hold_settle": 400 + 300, "hold_release": 600 + 500},  # the retry used 300, not 700
        700,
        None,
    ),
    "retry-after-the-first-overran": (
        [
            *FIRST,
            sealed(RELEASED.time_us, 1_500),
            *THEN_RETRY,
            sealed(RETRY_RELEASED.time_us, 1_800),
        ],
        {"hold_settle": 1_000 + 300, "hold_release": 500},  # the overrun settles no retry
        1_800,
        None,
    ),
    "retry-running-after-the-first-settled": (
        [*FIRST, sealed(RELEASED.time_us, 400), RETRY],
        {"hold_settle": 400, "hold_release": 600, "open": 800},
        400,
        (800, 400, 0),
    ),
    "a-third-attempt-past-two-baselines": (
        [
            *FIRST,
            sealed(RELEASED.time_us, 400),
            *THEN_RETRY,
            sealed(RETRY_RELEASED.time_us, 700),
            HoldPlaced("job-1", "vision", None, Unit.MONEY, 500, T0_US + 3 * HOUR, T0_US + 400 * S),
            HoldReleased("job-1", T0_US + 500 * S, "completed"),
            sealed(T0_US + 500 * S, 1_300),
        ],
        {"hold_settle": 400 + 300 + 500, "hold_release": 600 + 500},
        1_300,
        None,
    ),
    # placed before the first attempt's hold settled: one hold, its earlier part apart
    "retry-joins-the-unsettled-first": (
        [*FIRST, RETRY, sealed(RELEASED.time_us, 400)],
        {"open": 1_800},  # the joined hold ends with the retry
        0,
        (1_800, 0, 1_000),
    ),
    "retry-joins-the-unsettled-first-then-both-settle": (
        [*FIRST, *THEN_RETRY, sealed(RETRY_RELEASED.time_us, 700)],
        {"hold_settle": 700, "hold_release": 1_100},
        700,
        None,
    ),
    "retry-after-the-first-settled-joins-nothing": (
        [*FIRST, sealed(RELEASED.time_us, 400), RETRY, sealed(RELEASED.time_us + S, 450)],
        {"hold_settle": 400, "hold_release": 600, "open": 800},  # still running: not settled
        400,
        (800, 400, 0),
    ),
}


@pytest.mark.parametrize(
    ("events", "expected", "baseline", "still_open"), RETRY_CASES.values(), ids=RETRY_CASES.keys()
)
def test_a_retried_jobs_hold_settles_by_its_own_attempts_usage(
    events: list[object],
    expected: dict[str, int],
    baseline: int,
    still_open: tuple[int, int, int] | None,
) -> None:
    feed = Feed()
    for event in events:
        feed.send(event)
    assert feed.hold_sums() == expected
    assert feed.store.hold_baselines().get(("job-1", Unit.MONEY), 0) == baseline
    hold = feed.store.open_holds().get(("job-1", Unit.MONEY))
    assert (None if hold is None else (hold.amount, hold.baseline, hold.earlier)) == still_open
    assert feed.store.dead_letters() == []
    replayed = Feed()  # a rebuild folds the same events: the same postings
    for event in events:
        replayed.send(event)
    assert replayed.store._s.booked == feed.store._s.booked


def test_a_whole_ledger_logs_the_watermark_and_settles_as_before() -> None:
    feed = Feed(ShardRole.WHOLE)
    for event in (PLACED, RELEASED, sealed(RELEASED.time_us, 400)):
        feed.send(event)
    assert feed.hold_sums() == {"hold_release": 1_000}  # released whole: no usage metered
    assert [e.outcome for e in feed.store.admin_entries()] == [SEALED_ELSEWHERE]
    assert feed.store.admin_view().sealed is None


OUTCOMES = {
    "newer": ([sealed(T0_US), sealed(T0_US + 1)], ["applied", "applied"], T0_US + 1),
    "not-newer": ([sealed(T0_US + 1), sealed(T0_US, 5)], ["applied", SEALED_NOT_NEWER], T0_US + 1),
    "with-a-role": ([sealed(T0_US, role=Role.ADMIN)], [], None),
}


@pytest.mark.parametrize(("events", "outcomes", "newest"), OUTCOMES.values(), ids=OUTCOMES.keys())
def test_only_a_newer_watermark_made_by_the_ledger_applies(
    events: list[ShardsSealedThrough], outcomes: list[str], newest: int | None
) -> None:
    feed = Feed()
    for event in events:
        feed.send(event)
    assert [e.outcome for e in feed.store.admin_entries()] == outcomes
    found = feed.store.admin_view().sealed
    assert (found.through_us if found else None) == newest
    assert len(feed.store.dead_letters()) == len(events) - len(outcomes)


NOV_20 = T0_US + 19 * 24 * HOUR  # 2026-11-20
DEC_02 = T0_US + 31 * 24 * HOUR  # 2026-12-02


def test_a_budget_that_carries_over_grants_from_the_watermarks_spending() -> None:
    """Nov's allowance when the watermark enters November; December's (the allowance and
    November's unspent remainder) only when it enters December, not by the jobs clock."""
    feed = Feed()
    feed.send(
        BudgetPolicySet(
            "vision", Unit.MONEY, 1_000, Cadence.MONTH, "2026-11", None, CarryOver.ALL, None,
            "alice", "budget", T0_US,
        )
    )  # fmt: skip
    feed.send(sealed(NOV_20))
    feed.send(HoldPlaced("job-2", "vision", None, Unit.MONEY, 5, DEC_02 + HOUR, DEC_02))
    granted = feed.store.admin_view().allowances
    assert [(a.period, a.allowance, a.carried) for a in granted.values()] == [("2026-11", 1_000, 0)]
    spent = (TeamUsage("vision", Unit.MONEY, "2026-11", 300),)
    feed.send(sealed(DEC_02, teams=spent))
    granted = feed.store.admin_view().allowances
    assert [(a.period, a.allowance, a.carried) for a in granted.values()] == [
        ("2026-11", 1_000, 0),
        ("2026-12", 1_000, 1_000 - 300),
    ]
