"""explain: why is my job waiting / why was it preempted, from the job's events."""

from ledger.job_events import FailReason, JobFailed
from scheduler.explain import explain
from scheduler.lifecycle import finish
from scheduler.model import Balance
from tests.scheduler_builders import HOUR_US, T0_US, a_cluster, a_spec


def test_a_waiting_job_says_why() -> None:
    cluster = a_cluster(balances=(Balance("vision", 1_000_000),))
    cluster.submit(a_spec("j", "vision", gpus=2, estimated_runtime_us=HOUR_US))
    cluster.cycle()
    text = explain("j", cluster.log)
    assert "now: waiting since 2026-11-01T00:00:01Z" in text
    assert "budget cannot cover" in text
    assert "money: balance 1000000" in text
    assert "waiting: budget_exhausted" in text


def test_a_preempted_job_says_by_whom_and_why() -> None:
    cluster = a_cluster()
    cluster.run(*(a_spec(f"a{i}", "audio", submit_us=T0_US + i) for i in range(16)))
    cluster.submit(a_spec("v", "vision", gpus=1))
    cluster.cycle()
    victim = next(f"a{i}" for i in range(16) if cluster.state.pending_job(f"a{i}"))
    text = explain(victim, cluster.log)
    assert "preempted by job v: reclaim_lent_quota" in text
    assert "last preempted at" in text and "borrowing quota the lender took back" in text
    assert "team vision reclaimed quota lent to team audio" in text


def test_a_running_and_a_finished_job() -> None:
    cluster = a_cluster()
    cluster.run(a_spec("j", "vision", gpus=2))
    assert "now: running" in explain("j", cluster.log)
    assert "admitted (attempt 1) on 2 GPU(s) of main/A100" in explain("j", cluster.log)
    cluster.apply(finish(cluster.running("j"), cluster.now_us))
    assert "now: finished" in explain("j", cluster.log)


def test_a_failed_job_says_whether_it_retries() -> None:
    events = [JobFailed("j", FailReason.EXIT_NONZERO, 1, False, T0_US, exit_code=2)]
    text = explain("j", events)
    assert "now: failed" in text and "exit code 2" in text and "not retried" in text


def test_an_unknown_job() -> None:
    assert "unknown job" in explain("nope", [])


def test_other_jobs_events_are_ignored() -> None:
    cluster = a_cluster()
    cluster.run(a_spec("other", "vision"))
    cluster.submit(a_spec("j", "vision"))
    assert "admitted" not in explain("j", cluster.log)
