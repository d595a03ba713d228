"""`ledger.read.job_history`: decoding the jobs topic, folding job events into rows, selecting and
summarising them, the plain-language explanation, and reading the raw-event archive."""

from __future__ import annotations

from dataclasses import replace

import orjson
import pytest

from ledger.holds import HoldPlaced, encode_hold, hold_envelope
from ledger.ingest import ConsumedMessage, Ingestor
from ledger.job_events import (
    FailReason,
    JobAdmitted,
    JobEvent,
    JobFailed,
    JobFinished,
    JobPreempted,
    JobReclaimed,
    JobSpec,
    JobStarted,
    JobSubmitted,
    JobWaiting,
    PreemptReason,
    WaitReason,
    encode_job_event,
    job_envelope,
    job_envelope_to_dict,
)
from ledger.periods import Period
from ledger.pricing import PriceBook
from ledger.read import job_history as jh
from ledger.store.hot import DuckDBStore
from ledger.store.schema import ARCHIVE_COMPRESS_FROM
from ledger.units import Unit
from tests.builders import T0_US

SOURCE = "tally://scheduler"
MIN = 60_000_000
HOUR = 60 * MIN
H100 = "NVIDIA H100 80GB HBM3"


def submitted(job: str, at: int, team: str = "vision", gpus: int = 2, **kw) -> JobSubmitted:
    spec = JobSpec(job, team, "detection", "ada", "train", gpus, submit_us=at,
                   estimated_runtime_us=HOUR, **kw)  # fmt: skip
    return JobSubmitted(spec, at)


def admitted(job: str, at: int, team: str = "vision", attempt: int = 1, borrowed: int = 0):
    return JobAdmitted(
        job, team, "train", "h100", H100, ("GPU-0", "GPU-1"), ("n1", "n1"), priority=0,
        borrowed_gpus=borrowed, preemptible=True, hold_micros=0, hold_gpu_ms=0, attempt=attempt,
        time_us=at,
    )  # fmt: skip


def history() -> list[JobEvent]:
    """job-a: waits on quota, runs, is preempted by job-b, waits, runs again, finishes.
    job-b (search): runs. job-c: fails and retries, then fails for good. job-d: cancelled
    while waiting. job-e: reclaimed."""
    t = T0_US
    return [
        submitted("job-a", t),
        JobWaiting("job-a", WaitReason.QUOTA_EXHAUSTED, t + 1, "vision uses 2 of 2"),
        admitted("job-a", t + 10 * MIN, borrowed=1),
        JobStarted("job-a", t + 11 * MIN),
        submitted("job-b", t + 20 * MIN, team="search"),
        JobPreempted("job-a", "job-b", PreemptReason.RECLAIM_LENT_QUOTA, t + 71 * MIN, "lent"),
        admitted("job-b", t + 71 * MIN + 1, team="search"),
        JobStarted("job-b", t + 72 * MIN),
        JobWaiting("job-a", WaitReason.NO_CAPACITY, t + 75 * MIN),
        admitted("job-a", t + 131 * MIN, attempt=2),
        JobStarted("job-a", t + 132 * MIN),
        JobFinished("job-a", t + 191 * MIN),
        submitted("job-c", t, gpus=1),
        admitted("job-c", t + 5 * MIN),
        JobStarted("job-c", t + 5 * MIN),
        JobFailed("job-c", FailReason.EXIT_NONZERO, 1, True, t + 35 * MIN, exit_code=3),
        admitted("job-c", t + 45 * MIN, attempt=2),
        JobStarted("job-c", t + 45 * MIN),
        JobFailed("job-c", FailReason.EXIT_NONZERO, 2, False, t + 65 * MIN, exit_code=3),
        submitted("job-d", t + 5 * MIN),
        JobWaiting("job-d", WaitReason.NO_CAPACITY, t + 5 * MIN + 1),
        JobFailed("job-d", FailReason.CANCELLED, 0, False, t + 50 * MIN),
        submitted("job-e", t),
        admitted("job-e", t + MIN),
        JobStarted("job-e", t + MIN),
        JobReclaimed("job-e", ("GPU-0", "GPU-1"), t + 30 * MIN, t + 90 * MIN, "idle for 60 min"),
    ]


def rows() -> dict[str, jh.JobRow]:
    return {r.job_id: r for r in jh.fold_jobs(history())}


# ---------------------------------------------------------------------------- decoding


def test_a_message_holds_one_event_or_an_array_and_hold_events_are_passed_over():
    event = JobStarted("job-a", T0_US)
    single = encode_job_event(event, SOURCE)
    assert [e.data for e in jh.job_envelopes(single)[0]] == [event]
    other = JobFinished("job-a", T0_US + 1)
    array = orjson.dumps([job_envelope_to_dict(job_envelope(e, SOURCE)) for e in (event, other)])
    assert [e.data for e in jh.job_envelopes(array)[0]] == [event, other]
    hold = HoldPlaced("job-a", "vision", None, Unit.MONEY, 5, T0_US + HOUR, T0_US)
    assert jh.job_envelopes(encode_hold(hold_envelope(hold))[1]) == ((), 0)


def test_undecodable_messages_are_counted_never_raised():
    tampered = orjson.loads(encode_job_event(JobStarted("job-a", T0_US), SOURCE))
    tampered["data"]["time_us"] += 1  # the id no longer matches the content
    for value in (b"", b"{not json", orjson.dumps(tampered)):
        assert jh.job_envelopes(value) == ((), 1)


def test_the_log_counts_a_resent_event_once_and_keeps_publication_order():
    events = history()[:4]
    values = [encode_job_event(e, SOURCE) for e in events]
    log = jh.job_event_log([*values, values[1], b"junk"])
    assert log.events == tuple(events)
    assert (log.messages, log.undecodable, log.newest_us) == (6, 1, events[-1].time_us)


# ---------------------------------------------------------------------------- the fold


def test_a_preempted_job_waits_again_and_counts_its_attempts_waits_and_runs():
    a = rows()["job-a"]
    assert a.state is jh.JobState.FINISHED and a.ended_us == T0_US + 191 * MIN
    assert (a.team, a.queue, a.gpus, a.pool, a.model) == ("vision", "train", 2, "h100", H100)
    assert a.attempts == 2
    (p,) = a.preemptions
    assert (p.by, p.reason, p.detail) == ("job-b", PreemptReason.RECLAIM_LENT_QUOTA, "lent")
    assert a.first_started_us == T0_US + 11 * MIN and a.first_wait_us == 11 * MIN
    assert a.waited_us == 10 * MIN + 60 * MIN  # before the first admission, after preemption
    assert a.ran_us == 61 * MIN + 60 * MIN
    assert a.wait_reason is None and a.waiting_since_us is None


def test_the_state_between_events_follows_the_scheduler():
    events = history()
    at = {n: jh.fold_jobs(events[:n])[0] for n in (2, 3, 4, 6, 9)}
    assert at[2].state is jh.JobState.WAITING
    assert (at[2].wait_reason, at[2].wait_detail) == (
        WaitReason.QUOTA_EXHAUSTED,
        "vision uses 2 of 2",
    )
    assert at[3].state is jh.JobState.STARTING and at[3].borrowed_gpus == 1
    assert at[4].state is jh.JobState.RUNNING
    assert at[6].state is jh.JobState.WAITING
    assert at[6].wait_reason is WaitReason.PREEMPTED  # until a cycle gives another reason
    assert at[6].since_us == T0_US + 71 * MIN
    assert at[9].wait_reason is WaitReason.NO_CAPACITY
    assert at[9].since_us == T0_US + 71 * MIN  # the wait began with the preemption
    assert at[9].waited_total_us(T0_US + 81 * MIN) == 10 * MIN + 10 * MIN


def test_failures_retries_cancels_and_reclaims():
    found = rows()
    c = found["job-c"]
    assert (c.state, c.attempts, c.fail_reason, c.exit_code) == (
        jh.JobState.FAILED, 2, FailReason.EXIT_NONZERO, 3,
    )  # fmt: skip
    assert c.waited_us == 5 * MIN + 10 * MIN and c.ran_us == 30 * MIN + 20 * MIN
    retrying = jh.fold_jobs(history()[12:16])[0]
    assert (retrying.state, retrying.wait_reason) == (jh.JobState.WAITING, WaitReason.RETRYING)
    d = found["job-d"]
    assert d.state is jh.JobState.CANCELLED and d.waited_us == 45 * MIN and d.attempts == 0
    assert found["job-e"].state is jh.JobState.RECLAIMED
    assert jh.outcome_text(c) == "failed: the program stopped with an error (exit code 3)"


def test_a_job_whose_submission_is_not_archived_still_gets_a_row():
    (row,) = jh.fold_jobs(history()[2:4])
    assert (row.team, row.queue, row.state, row.submitted_us) == (
        "vision", "train", jh.JobState.RUNNING, None,
    )  # fmt: skip
    assert row.first_wait_us is None


def test_select_by_team_pool_and_period():
    found = jh.fold_jobs(history())
    assert {r.job_id for r in jh.select_jobs(found, team="search")} == {"job-b"}
    assert {r.job_id for r in jh.select_jobs(found, pool="a100")} == set()
    november = Period.month("2026-11")
    assert len(jh.select_jobs(found, period=november)) == 5
    assert jh.select_jobs(found, period=Period.month("2026-10")) == ()
    later = jh.select_jobs(found, period=Period.month("2026-12"))
    assert [r.job_id for r in later] == ["job-b"]  # still running


# ---------------------------------------------------------------------------- queue waits


def test_quantiles_are_nearest_observed_ranks():
    values = list(range(1, 101))
    assert jh.quantile_us(values, 50) == 50
    assert jh.quantile_us(values, 95) == 95
    assert jh.quantile_us([7], 95) == 7
    assert jh.quantile_us([], 95) == 0
    assert jh.quantile_us([3, 1, 2], 50) == 2


def test_daily_and_observed_queue_waits():
    found = jh.fold_jobs(history())
    (day,) = jh.daily_queue_waits(found)
    # first waits: a 11 min, b 52 min, c 5 min, e 1 min; all started on 2026-11-01
    assert (day.day_us, day.pool, day.model, day.jobs) == (T0_US, "h100", H100, 4)
    assert (day.p50_us, day.p95_us, day.max_us) == (5 * MIN, 52 * MIN, 52 * MIN)
    assert jh.daily_queue_waits(found, since_us=T0_US + 6 * MIN)[0].jobs == 2
    assert jh.daily_queue_waits(found, pool="a100") == ()
    open_jobs = jh.fold_jobs(history()[:9])  # job-a waits after its preemption
    seen = jh.observed_waits(open_jobs, H100, T0_US, T0_US + 100 * MIN)
    assert (seen.started, seen.p95_us) == (2, 52 * MIN)
    assert (seen.waiting, seen.longest_waiting_us) == (1, 29 * MIN)


# ---------------------------------------------------------------------------- explaining


def test_the_explanation_names_the_wait_reason_the_preemptor_and_what_to_do():
    events = history()[:9]
    teams = jh.job_teams(jh.fold_jobs(events))
    why = jh.explain_job("job-a", events, T0_US + 100 * MIN, teams)
    assert why.state is jh.JobState.WAITING
    assert why.headline.startswith("job-a has been waiting for 29 min (since 2026-11-01 01:11 UTC)")
    assert "all GPUs of the kind it needs are busy right now" in why.headline
    assert "stopped at 2026-11-01 01:11 UTC by job-b of team search" in why.headline
    assert "borrowed from another team" in why.headline
    assert why.advice == jh.WAIT_ADVICE[WaitReason.NO_CAPACITY]
    assert why.preemptions == 1 and why.waited_us == 10 * MIN + 29 * MIN
    texts = [t.text for t in why.timeline]
    assert texts[0].startswith("Submitted by ada (project detection) to queue train")
    assert "1 of them borrowed from other teams' unused quota" in texts[2]
    assert texts[4].startswith("Stopped to make room for job-b of team search")


def test_explanations_of_ended_and_unknown_jobs():
    events = history()
    assert "finished at 2026-11-01 03:11 UTC" in jh.explain_job("job-a", events, 0).headline
    failed = jh.explain_job("job-c", events, 0)
    assert "failed" in failed.headline and "(exit code 3)" in failed.headline and failed.advice
    assert "was cancelled" in jh.explain_job("job-d", events, 0).headline
    assert "sat allocated but unused" in jh.explain_job("job-e", events, 0).headline
    unknown = jh.explain_job("42", events, 0)
    assert unknown.state is None and "no scheduler events for job 42" in unknown.headline
    assert jh.WAIT_PLAIN.keys() == jh.WAIT_ADVICE.keys() == jh.WAIT_SHORT.keys() == set(WaitReason)
    assert jh.PREEMPT_PLAIN.keys() == set(PreemptReason)


@pytest.mark.parametrize(
    ("us", "text"),
    [(5_000_000, "5 s"), (12 * MIN, "12 min"), (3 * HOUR + 5 * MIN, "3 h 05 min"),
     (52 * HOUR, "2 d 4 h")],
)  # fmt: skip
def test_durations_read_like_people_write_them(us, text):
    assert jh.duration_text(us) == text


# ---------------------------------------------------------------------------- the archive


def test_the_archive_holds_the_jobs_topic_in_publication_order(tmp_path):
    events = history()
    values = [encode_job_event(e, SOURCE) for e in events]
    # two partitions (jobs keyed by id), three batches, one resend, and an admin-free ledger
    by_job = {"job-a": 0, "job-b": 1, "job-c": 1, "job-d": 0, "job-e": 1}
    offsets = [0, 0]
    messages = []
    for event, value in [*zip(events, values, strict=True), (events[3], values[3])]:
        partition = by_job[event.job_id]
        messages.append(ConsumedMessage("tally.jobs", partition, offsets[partition], value))
        offsets[partition] += 1
    with DuckDBStore(tmp_path) as store:
        ingestor = Ingestor(store, "c", PriceBook(()), {})
        for chunk in (messages[:7], messages[7:15], messages[15:]):
            ingestor.apply(chunk)
        assert jh.read_job_event_log(tmp_path).events == ()  # nothing sealed yet
        store.seal()
    log = jh.read_job_event_log(tmp_path)
    assert log.events == tuple(events)
    assert (log.messages, log.undecodable) == (len(events) + 1, 0)
    assert jh.fold_jobs(log.events) == jh.fold_jobs(events)
    assert jh.read_job_event_log(tmp_path, "another.topic").events == ()


def test_a_large_job_event_archived_compressed_comes_back_whole(tmp_path):
    """A 48-GPU admission is over the size the archive compresses from."""
    uuids = tuple(f"GPU-node-{i // 8:02d}-{i % 8}" for i in range(48))
    events = [submitted("job-big", T0_US, gpus=48), replace(
        admitted("job-big", T0_US + MIN), gpu_uuids=uuids, nodes=tuple("n1" for _ in uuids)
    )]  # fmt: skip
    messages = [
        ConsumedMessage("tally.jobs", 0, i, encode_job_event(e, SOURCE))
        for i, e in enumerate(events)
    ]
    assert max(len(m.value or b"") for m in messages) >= ARCHIVE_COMPRESS_FROM
    with DuckDBStore(tmp_path) as store:
        Ingestor(store, "c", PriceBook(()), {}).apply(messages)
        store.seal()
    log = jh.read_job_event_log(tmp_path)
    assert (log.events, log.undecodable) == (tuple(events), 0)


def test_a_share_jobs_row_keeps_its_share_and_its_explanation_says_it() -> None:
    share = submitted("s", T0_US, gpus=1, gpu_share=250)
    row = {r.job_id: r for r in jh.fold_jobs([share, submitted("w", T0_US)])}
    assert row["s"].gpu_share == 250 and row["w"].gpu_share is None
    events = [share, admitted("s", T0_US + MIN)]
    why = jh.explain_job("s", events, T0_US + 2 * MIN)
    assert "a 0.25 share of one GPU of" in why.headline
