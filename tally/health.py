"""Liveness and readiness of Tally's long-running processes, decided from status snapshots.

Each process (worker, scheduler, collector, alert delivery) serves `/healthz` and `/readyz`
beside its `/metrics` (`tally.health_http`). What they answer is decided here, by pure
functions from a snapshot of plain values to a `Verdict`: named checks, each passed or not
with a one-line reason. The process's adapter (`tally.health_sources`) takes the snapshot.

`/healthz` (alive): the process's event loop ticked within `stall_s` (a heartbeat task sets
the time; before its first tick the process counts as starting for `stall_s`) and no fatal
condition holds. 503 means: restart me.

`/readyz` (connected and caught up), per process:

- worker: the broker was reached (its cluster id is known, the latest samples fetch did not
  fail and the broker answered one within `ANSWER_STALE_S`), the samples consumer holds at
  least one partition, and its lag (the messages on its partitions it has not applied) is
  known and at most `max_lag` (`worker.ready_max_lag`);
- scheduler: the jobs topic has been replayed (the state is rebuilt), the API serves, and the
  latest read of the balances and alerts topics did not fail;
- collector: the producer is connected to the broker and the disk spool is empty (nothing
  waits to be replayed);
- alerts: the alerts consumer holds at least one partition, its latest fetch did not fail and
  the broker answered one within `ANSWER_STALE_S`.

Bodies are JSON: `{"status": "ready" | "not_ready", "checks": {NAME: {"ok": …, "detail": …}}}`
for `/readyz`, `"alive" | "dead"` for `/healthz`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

DEFAULT_STALL_S = 30.0
DEFAULT_MAX_LAG = 10_000
ANSWER_STALE_S = 30.0  # a consumer whose fetches went unanswered this long is disconnected


@dataclass(frozen=True, slots=True)
class Check:
    ok: bool
    detail: str


@dataclass(frozen=True, slots=True)
class Verdict:
    """Named checks; the verdict holds when every check passed."""

    checks: tuple[tuple[str, Check], ...]

    @property
    def ok(self) -> bool:
        return all(check.ok for _, check in self.checks)

    def failed(self) -> tuple[str, ...]:
        return tuple(name for name, check in self.checks if not check.ok)

    def body(self, good: str, bad: str) -> dict[str, Any]:
        return {
            "status": good if self.ok else bad,
            "checks": {name: {"ok": c.ok, "detail": c.detail} for name, c in self.checks},
        }


def _verdict(checks: Mapping[str, Check]) -> Verdict:
    return Verdict(tuple(checks.items()))


# ---------------------------------------------------------------------------- liveness


@dataclass(frozen=True, slots=True)
class Liveness:
    """`loop_age_s`: seconds since the event loop's heartbeat last ticked (None: never);
    `up_s`: seconds since the process started watching (a loop that has not ticked yet is
    starting, not stalled, for `stall_s`); `fatal`: why the process cannot go on, if so."""

    loop_age_s: float | None
    up_s: float = 0.0
    fatal: str | None = None


def liveness(status: Liveness, stall_s: float = DEFAULT_STALL_S) -> Verdict:
    age = status.loop_age_s
    if age is None and status.up_s <= stall_s:
        loop = Check(True, f"starting ({status.up_s:.1f} s)")
    elif age is None:
        loop = Check(False, f"the event loop has not ticked in {status.up_s:.1f} s")
    elif age > stall_s:
        loop = Check(False, f"the event loop last ticked {age:.1f} s ago (limit {stall_s:g} s)")
    else:
        loop = Check(True, f"the event loop ticked {age:.1f} s ago")
    fatal = Check(status.fatal is None, status.fatal or "no fatal condition")
    return _verdict({"loop": loop, "fatal": fatal})


# ---------------------------------------------------------------------------- readiness


def _broker(connected: bool, error: str | None, answer_age_s: float | None = None) -> Check:
    if connected and answer_age_s is not None and answer_age_s > ANSWER_STALE_S:
        return Check(False, f"no fetch answered for {answer_age_s:.0f} s")
    if connected:
        return Check(True, "connected")
    return Check(False, f"not connected: {error}" if error else "not connected yet")


@dataclass(frozen=True, slots=True)
class WorkerStatus:
    """`incarnation_known`: the broker's cluster id was read; `fetch_error`: why the latest
    samples fetch failed (None: it did not); `partitions`: samples partitions assigned; `lag`:
    messages on them not applied yet (None: not known before the first fetch);
    `answer_age_s`: since the broker last answered a fetch (None: not known)."""

    incarnation_known: bool
    fetch_error: str | None
    partitions: int
    lag: int | None
    answer_age_s: float | None = None


def worker_readiness(status: WorkerStatus, max_lag: int = DEFAULT_MAX_LAG) -> Verdict:
    connected = status.incarnation_known and status.fetch_error is None
    if status.partitions > 0:
        assigned = Check(True, f"{status.partitions} samples partitions assigned")
    else:
        assigned = Check(False, "no samples partition assigned")
    if status.lag is None:
        lag = Check(False, "lag not known yet (no fetch answered)")
    elif status.lag > max_lag:
        lag = Check(False, f"{status.lag} messages behind (limit {max_lag})")
    else:
        lag = Check(True, f"{status.lag} messages behind (limit {max_lag})")
    return _verdict(
        {
            "broker": _broker(connected, status.fetch_error, status.answer_age_s),
            "assigned": assigned,
            "lag": lag,
        }
    )


@dataclass(frozen=True, slots=True)
class SchedulerStatus:
    """`replayed`: the jobs topic was read to its end and the state rebuilt; `serving`: the API
    listens; `feed_error`: why the latest balances/alerts read failed (None: it did not)."""

    replayed: bool
    serving: bool
    feed_error: str | None


def scheduler_readiness(status: SchedulerStatus) -> Verdict:
    return _verdict(
        {
            "broker": _broker(status.replayed and status.feed_error is None, status.feed_error),
            "replayed": Check(
                status.replayed,
                "jobs topic replayed" if status.replayed else "replaying the jobs topic",
            ),
            "api": Check(status.serving, "serving" if status.serving else "not serving yet"),
        }
    )


@dataclass(frozen=True, slots=True)
class CollectorStatus:
    """`connected`: the producer holds a broker connection; `spool_records`: messages waiting
    in the disk spool (0 without a spool)."""

    connected: bool
    spool_records: int


def collector_readiness(status: CollectorStatus) -> Verdict:
    records = status.spool_records
    return _verdict(
        {
            "broker": _broker(status.connected, None),
            "spool": Check(
                records == 0,
                "empty" if records == 0 else f"{records} messages wait to be replayed",
            ),
        }
    )


@dataclass(frozen=True, slots=True)
class AlertsStatus:
    """`partitions`: alerts partitions the consumer holds; `fetch_error`: why the latest
    fetch failed (None: it did not, or none ran yet); `answer_age_s`: since the broker last
    answered a fetch (None: not known)."""

    started: bool
    partitions: int
    fetch_error: str | None
    answer_age_s: float | None = None


def alerts_readiness(status: AlertsStatus) -> Verdict:
    if status.partitions > 0:
        assigned = Check(True, f"{status.partitions} alerts partitions assigned")
    else:
        assigned = Check(False, "no alerts partition assigned")
    return _verdict(
        {
            "broker": _broker(
                status.started and status.fetch_error is None,
                status.fetch_error,
                status.answer_age_s,
            ),
            "assigned": assigned,
        }
    )
