"""Holds: placed by events on the jobs topic, settled by metered usage, released by completion,
cancel or expiry — as postings on a real DuckDB/Parquet ledger."""

from __future__ import annotations

from dataclasses import dataclass

import orjson
import pytest

from ledger.events import encode_batch
from ledger.holds import (
    HoldPlaced,
    HoldReleased,
    encode_hold,
    hold_envelope,
)
from ledger.ingest import ConsumedMessage, Ingestor, InputTopics, OutputTopics
from ledger.job_events import (
    FailReason,
    JobEvent,
    JobFailed,
    JobFinished,
    JobPreempted,
    JobStarted,
    PreemptReason,
    encode_job_event,
    ended_for_good,
)
from ledger.jobs_message import decode_jobs_message
from ledger.pricing import Price, PriceBook
from ledger.read.queries import LedgerQueries
from ledger.store.hot import DuckDBStore
from ledger.store.verify import verify_ledger
from ledger.units import Unit
from tests.builders import INTERVAL_US, T0_US, a_process, an_envelope, an_owner

PRICES = PriceBook((Price("*", 3_600_000),))  # one micro-unit per GPU-ms: 10,000 per sample
SAMPLE_MS = INTERVAL_US // 1_000
HOUR_US = 3_600_000_000


def placed(amount, unit=Unit.GPU_MS, job="job-1", at=0, expires=HOUR_US, team="vision"):
    return HoldPlaced(job, team, "detection", unit, amount, T0_US + expires, T0_US + at)


def released(job="job-1", at=30 * INTERVAL_US):
    return HoldReleased(job, T0_US + at, "completed")


@dataclass(frozen=True)
class Usage:
    """`samples` ten-second samples of `job` on one GPU, ending at sample number `first` on."""

    samples: int
    job: str = "job-1"
    first: int = 1
    gpu: str = "GPU-1"


def _message(offset, step):
    if isinstance(step, Usage):
        envelopes = [
            an_envelope(
                gpu_uuid=step.gpu,
                sample_time_us=T0_US + (step.first + i) * INTERVAL_US,
                processes=(a_process(owner=an_owner("vision", "detection", "ada", step.job)),),
            )
            for i in range(step.samples)
        ]
        return ConsumedMessage("samples", 0, offset, encode_batch(envelopes))
    _key, value = encode_hold(hold_envelope(step))
    return ConsumedMessage("jobs", 0, offset, value)


def run(store, *steps):
    ing = Ingestor(
        store,
        "c",
        PRICES,
        {},
        topics=OutputTopics("alerts", "dl", "balances"),
        inputs=InputTopics("admin", "jobs"),
    )
    offsets = {"samples": 0, "jobs": 0}
    results = []
    for step in steps:
        message = _message(0, step)
        message = ConsumedMessage(message.topic, 0, offsets[message.topic], message.value)
        offsets[message.topic] += 1
        results.append(ing.apply([message]))
    return results


def hold_balance(store, unit="gpu_ms"):
    return sum(
        r.balance for r in store.balance_rows() if r.account == "hold:vision" and r.unit == unit
    )


def kinds(store):
    store.seal()
    rows = LedgerQueries(store.data_dir)._query(
        "SELECT kind, sum(amount) FROM {postings} WHERE account = 'hold:vision' "
        "GROUP BY kind ORDER BY kind"
    )
    return {kind: int(total) for kind, total in rows}


@pytest.fixture
def store(tmp_path):
    with DuckDBStore(tmp_path / "ledger") as s:
        yield s


@pytest.mark.parametrize(
    ("steps", "open_after", "by_kind"),
    [
        pytest.param(
            [placed(100_000), Usage(3), released()],
            0,
            {"hold": 100_000, "hold_settle": -30_000, "hold_release": -70_000},
            id="place-settle-release",
        ),
        pytest.param(
            [placed(100_000), Usage(3)],
            70_000,
            {"hold": 100_000, "hold_settle": -30_000},
            id="partly-settled-stays-open",
        ),
        pytest.param(
            [placed(25_000), Usage(3), released()],
            0,
            {"hold": 25_000, "hold_settle": -25_000},
            id="usage-beyond-the-hold-settles-only-the-hold",
        ),
        pytest.param(
            [placed(100_000), Usage(2, job="job-2"), released("job-2")],
            100_000,
            {"hold": 100_000},
            id="another-jobs-usage-settles-nothing",
        ),
        pytest.param(
            [placed(60_000), placed(40_000, at=1), Usage(1), Usage(1, first=2)],
            80_000,
            {"hold": 100_000, "hold_settle": -20_000},
            id="placements-add-up-and-settle-batch-by-batch",
        ),
        pytest.param(
            [placed(100_000, expires=50 * INTERVAL_US), Usage(2), Usage(1, first=60)],
            0,
            {"hold": 100_000, "hold_settle": -20_000, "hold_release": -80_000},
            id="expired-once-a-later-sample-arrives",
        ),
        pytest.param(
            [released(), placed(100_000, at=40 * INTERVAL_US)],
            100_000,
            {"hold": 100_000},
            id="a-release-with-nothing-open-is-a-no-op",
        ),
    ],
)
def test_hold_lifecycle(store, steps, open_after, by_kind):
    results = run(store, *steps)
    assert all(not r.dead_letters for r in results)
    assert hold_balance(store) == open_after
    assert sum(h.amount for h in store.open_holds().values()) == open_after
    assert kinds(store) == by_kind
    assert verify_ledger(store.data_dir).ok


def test_holds_in_two_units_release_together(store):
    run(store, placed(100_000), placed(250_000, Unit.MONEY), Usage(2), released())
    assert (hold_balance(store), hold_balance(store, "money_micros")) == (0, 0)
    store.seal()
    rows = LedgerQueries(store.data_dir)._query(
        "SELECT kind, account, unit, sum(amount) FROM {postings} "
        "WHERE kind LIKE 'hold%' GROUP BY ALL ORDER BY ALL"
    )
    assert [tuple(r) for r in rows] == [
        ("hold", "hold:vision", "gpu_ms", 100_000),
        ("hold", "hold:vision", "money_micros", 250_000),
        ("hold", "holds-outstanding:vision", "gpu_ms", -100_000),
        ("hold", "holds-outstanding:vision", "money_micros", -250_000),
        ("hold_release", "hold:vision", "gpu_ms", -80_000),
        ("hold_release", "hold:vision", "money_micros", -230_000),
        ("hold_release", "holds-outstanding:vision", "gpu_ms", 80_000),
        ("hold_release", "holds-outstanding:vision", "money_micros", 230_000),
        ("hold_settle", "hold:vision", "gpu_ms", -20_000),
        ("hold_settle", "hold:vision", "money_micros", -20_000),
        ("hold_settle", "holds-outstanding:vision", "gpu_ms", 20_000),
        ("hold_settle", "holds-outstanding:vision", "money_micros", 20_000),
    ]


def test_hold_events_apply_exactly_once(store):
    first = run(store, placed(100_000))[0]
    assert first.commit.transactions == 1
    again = Ingestor(store, "c", PRICES, {}, inputs=InputTopics("admin", "jobs")).apply(
        [_message(0, placed(100_000)), _message(1, placed(100_000))]
    )
    assert (again.skipped_messages, again.commit.duplicates) == (1, 1)
    assert hold_balance(store) == 100_000


def test_a_placement_for_another_team_is_refused(store):
    results = run(store, placed(100_000), placed(5, team="language", at=1))
    assert [d.reason for d in results[1].dead_letters] == [
        "job job-1 already holds gpu_ms of team vision"
    ]


def test_the_scheduler_job_events_on_the_topic_are_passed_over():
    job_event = encode_job_event(JobStarted("job-1", T0_US), "tally://scheduler")
    _key, hold = encode_hold(hold_envelope(placed(5)))
    read = decode_jobs_message(b"[" + job_event + b"," + hold + b"]")
    assert (len(read.holds), read.dead, read.ignored) == (1, (), 1)
    assert read.holds[0] == hold_envelope(placed(5))


ENDS = {
    "finished": (JobFinished("job-1", T0_US), True),
    "failed-for-good": (JobFailed("job-1", FailReason.CANCELLED, 1, False, T0_US), True),
    "failed-retried": (JobFailed("job-1", FailReason.EXIT_NONZERO, 1, True, T0_US), False),
    "preempted": (JobPreempted("job-1", "job-2", PreemptReason.HIGHER_PRIORITY, T0_US), False),
    "started": (JobStarted("job-1", T0_US), False),
}


@pytest.mark.parametrize(("event", "ends"), ENDS.values(), ids=ENDS.keys())
def test_a_job_ends_for_good_when_it_finishes_or_fails_unretried(event: JobEvent, ends: bool):
    """What a global shard drops a job's hold baselines on (`ended_for_good`): the scheduler
    places no hold for the job afterwards."""
    read = decode_jobs_message(encode_job_event(event, "tally://scheduler"))
    assert ended_for_good(read.audited) == ({"job-1": T0_US} if ends else {})


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        pytest.param({"amount": 0}, "out of range", id="zero"),
        pytest.param({"amount": 2.5}, "expected an integer, got float", id="float"),
        pytest.param({"unit": "energy_mj"}, "a hold is in money_micros or gpu_ms", id="unit"),
        pytest.param({"expires_us": 1}, "expires_us", id="expires-before-placed"),
        pytest.param({"colour": "red"}, "unknown fields", id="unknown-field"),
    ],
)
def test_bad_holds_are_dead_letters(data, reason):
    _key, value = encode_hold(hold_envelope(placed(5)))
    doc = orjson.loads(value)
    doc["data"].update(data)
    read = decode_jobs_message(orjson.dumps(doc))
    assert read.holds == ()
    assert reason in read.dead[0].reason
