"""Idle detection per GPU share (`ledger.idle_shares`): each share of a time-sliced GPU is idle
or busy by its own job's processes on the GPU, under its own subject `<GPU>/share/<job>`, with
the whole-GPU detector's grace period and alerts; its idle flag lands on its own legs only, and
the GPU's parts still sum to its physical time. Table tests through the real ingest (the
in-memory store), one through DuckDB and its sealed segments (the Finance figures per share),
and one from the ledger's alerts to the scheduler's reclaim of the idle share alone."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest

from ledger.accounts import capacity_account
from ledger.alerts import decode_alert
from ledger.attribution import physical_gpu_ms
from ledger.events import Owner, ProcessUsage, SampleSource, encode_batch, envelope_for
from ledger.fractional import share_key, share_parent
from ledger.idle import MINUTE_US, IdlePolicy
from ledger.idle_shares import share_util, unresolved
from ledger.ingest import ConsumedMessage, Ingestor, OutputTopics
from ledger.job_events import (
    GpuAssigned,
    GpuReleased,
    JobReclaimed,
    JobStarted,
    encode_job_event,
)
from ledger.pricing import Price, PriceBook
from ledger.read.reports import ReportQueries, cost_report
from ledger.read.rollups.finance import top_jobs
from ledger.read.rollups.shared import Filters
from ledger.store.hot import DuckDBStore
from ledger.store.memory import MemoryStore
from ledger.store.port import LedgerStore
from ledger.units import Unit
from scheduler.executors.fake import RUNS_FOREVER
from tests.builders import T0_US, a_mig, a_process, a_sample, an_owner
from tests.unit.test_scheduler_service_support import Rig
from tests.unit.test_share_charging import share_assigned, share_released

GPU = a_sample().gpu_uuid
POOL, MODEL = a_sample().pool, a_sample().model
POLICY = IdlePolicy(5, 3 * MINUTE_US, 10, 2 * MINUTE_US)  # 3 min grace, 2 min busy resolves
PRICES = PriceBook((Price("*", 3_600_000),))  # one micro per GPU-ms
MIG_SUBJECT = f"{GPU}/gi1"
NVML, DCGM = SampleSource.NVML, SampleSource.DCGM


class Feed:
    """An ingestor's input over a store: jobs-topic events and one-minute samples."""

    def __init__(self, store: LedgerStore) -> None:
        self.store = store
        self.offsets: dict[str, int] = {}

    def _apply(self, topic: str, values: list[bytes]) -> None:
        first = self.offsets.get(topic, 0)
        self.offsets[topic] = first + len(values)
        messages = [ConsumedMessage(topic, 0, first + i, v) for i, v in enumerate(values)]
        topics = OutputTopics("alerts", "dl", None)
        Ingestor(self.store, "c", PRICES, {}, POLICY, topics).apply(messages)

    def jobs(self, *events: GpuAssigned | GpuReleased) -> None:
        self._apply("tally.jobs", [encode_job_event(e, "tally://scheduler") for e in events])

    def samples(self, *envelopes) -> None:
        self._apply("samples", [encode_batch(list(envelopes))])

    def alerts(self) -> list[tuple[str, str, str | None]]:
        """(kind, subject, reason) of every idle alert queued, sorted."""
        found = [decode_alert(m.value) for m in self.store.pending_outbox() if m.topic == "alerts"]
        return sorted((a.kind.value, a.subject, a.reason) for a in found)


def minute(
    m: int,
    sm: Mapping[str, int],
    mig: bool = False,
    gpu: str = GPU,
    start: int = T0_US,
    dcgm: bool = False,
):
    """The sample of minute `m` after `start`: one process per job in `sm`, with its SM % (as
    dcgm-exporter reads it: the GPU's utilisation only, no processes)."""
    processes = tuple(
        a_process(pid=100 + i, sm=util, owner=an_owner("vision", "p", "u", job))
        for i, (job, util) in enumerate(sorted(sm.items()))
    )
    sample = a_sample(
        gpu_uuid=gpu,
        sample_time_us=start + (m + 1) * MINUTE_US,
        interval_us=MINUTE_US,
        util_gpu_pct=min(100, sum(sm.values())),
        processes=() if dcgm else processes,
        source=DCGM if dcgm else SampleSource.SIMULATED,
        mig=a_mig() if mig else None,
    )
    return envelope_for(sample, "sim://node-01")


@dataclass(frozen=True)
class ShareIdleCase:
    shares: tuple[tuple[str, int], ...]  # job, per-mille, held from T0
    minutes: tuple[dict[str, int], ...]  # per minute: job → its process's SM % (absent: none)
    alerts: tuple[tuple[str, str, str | None], ...]  # kind, subject ("a": a's share), reason
    idle_minutes: dict[str, set[int]]  # job → the minutes its legs are flagged idle
    released: tuple[tuple[str, int], ...] = ()  # job, the minute at whose start it is released
    mig: bool = False  # the samples are of MIG instance gi1 (its own process: job "m")
    whole_idle: set[int] = field(default_factory=set)  # minutes flagged as a whole transaction
    dcgm: bool = False  # the samples are dcgm-exporter's: the GPU's utilisation, no processes


DETECTED, RESOLVED = "tally.idle.detected", "tally.idle.resolved"
CASES = {
    "one-share-idle-while-the-other-works": ShareIdleCase(
        (("a", 500), ("b", 250)),
        ({"a": 0, "b": 80},) * 6,  # the GPU is 80 % busy: a whole-GPU detector sees no waste
        ((DETECTED, "a", None),),
        {"a": {2, 3, 4, 5}},
    ),
    "both-idle-one-without-a-process": ShareIdleCase(
        (("a", 500), ("b", 250)),
        ({"a": 1},) * 5,  # b has no process on the GPU: idle in every sample
        ((DETECTED, "a", None), (DETECTED, "b", None)),
        {"a": {2, 3, 4}, "b": {2, 3, 4}},
    ),
    "a-share-idle-past-its-grace-then-busy-again": ShareIdleCase(
        (("a", 500), ("b", 250)),
        ({"a": 0, "b": 60},) * 4 + ({"a": 50, "b": 60},) * 3,
        ((DETECTED, "a", None), (RESOLVED, "a", "busy_again")),
        {"a": {2, 3}},
    ),
    "a-pause-shorter-than-the-grace-is-not-idle": ShareIdleCase(
        (("a", 500),),
        ({"a": 0},) * 2 + ({"a": 70},) + ({"a": 0},) * 2,
        (),
        {},
    ),
    "a-share-released-while-idle": ShareIdleCase(
        (("a", 500), ("b", 250)),
        ({"a": 0, "b": 80},) * 4 + ({"b": 80},) * 2,
        ((DETECTED, "a", None), (RESOLVED, "a", "released")),
        {"a": {2, 3}},
        released=(("a", 4),),
    ),
    "mig-untouched-its-instance-is-its-own-subject": ShareIdleCase(
        (("a", 500),),  # a share of the GPU beside: no whole-GPU sample steps it
        ({"m": 0},) * 5,
        ((DETECTED, "mig", None),),
        {"m": {2, 3, 4}},
        mig=True,
        whole_idle={2, 3, 4},
    ),
    "dcgm-only-shares-are-busy-while-their-gpu-works": ShareIdleCase(
        (("a", 500), ("b", 250)),
        ({"a": 0, "b": 80},) * 6,  # which share works dcgm cannot tell: neither is flagged
        (),
        {},
        dcgm=True,
    ),
    "dcgm-only-shares-idle-with-their-gpu": ShareIdleCase(
        (("a", 500), ("b", 250)),
        ({"a": 0, "b": 0},) * 4 + ({"a": 0, "b": 60},) * 3,
        (
            (DETECTED, "a", None),
            (DETECTED, "b", None),
            (RESOLVED, "a", "busy_again"),
            (RESOLVED, "b", "busy_again"),
        ),
        {"a": {2, 3}, "b": {2, 3}},
        dcgm=True,
    ),
}


def subject_of(label: str) -> str:
    return MIG_SUBJECT if label == "mig" else share_key(GPU, label)


def run(case: ShareIdleCase, store: LedgerStore, batched: bool):
    """Feed the case (one batch per minute, or per run of minutes between releases): its
    alerts, and per job the minutes whose legs are flagged idle."""
    feed = Feed(store)
    feed.jobs(*(share_assigned(job, "vision", share, T0_US) for job, share in case.shares))
    envelopes = [minute(m, sm, case.mig, dcgm=case.dcgm) for m, sm in enumerate(case.minutes)]
    release_at = {m: job for job, m in case.released}
    pending: list = []
    for m, envelope in enumerate(envelopes):
        if m in release_at:
            if pending:
                feed.samples(*pending)
                pending = []
            feed.jobs(share_released(release_at[m], "vision", T0_US + m * MINUTE_US))
        pending.append(envelope)
        if not batched:
            feed.samples(*pending)
            pending = []
    if pending:
        feed.samples(*pending)
    idle: dict[str, set[int]] = {}
    whole: set[int] = set()
    for m, envelope in enumerate(envelopes):
        txn = store.find_transaction(envelope.id)
        assert txn is not None
        ms = [p for p in txn.postings if p.unit is Unit.GPU_MS]
        capacity = sum(p.amount for p in ms if p.account == capacity_account(POOL, MODEL))
        held = sum(p.amount for p in ms if p.account != capacity_account(POOL, MODEL))
        assert held == -capacity == physical_gpu_ms(envelope.data)  # the parts sum to the GPU
        if txn.idle:
            whole.add(m)
        for p in txn.postings:
            if (txn.idle or p.idle) and p.team is not None and p.job_id:
                idle.setdefault(p.job_id, set()).add(m)
    return feed.alerts(), idle, whole


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_each_share_is_idle_by_its_own_processes(case: ShareIdleCase) -> None:
    alerts, idle, whole = run(case, MemoryStore(), batched=False)
    expected = sorted((kind, subject_of(label), reason) for kind, label, reason in case.alerts)
    assert alerts == expected
    assert idle == case.idle_minutes
    assert whole == case.whole_idle  # a share's flags are its own legs', never the transaction's
    assert run(case, MemoryStore(), batched=True) == (alerts, idle, whole)  # batches agree


@pytest.mark.parametrize(
    ("processes", "gpu_util", "job", "expected", "source"),
    [
        pytest.param(((None, 90),), 90, "a", 0, NVML, id="no-process-of-its-job-is-idle"),
        pytest.param((("a", 30), ("a", 25), ("b", 40)), 95, "a", 55, NVML,
                     id="its-processes-summed"),
        pytest.param((("a", 80), ("a", 70)), 100, "a", 100, NVML, id="at-most-100"),
        pytest.param((("a", None), ("b", None)), 64, "a", 64, NVML, id="no-sm-reported-the-gpus"),
        pytest.param((("a", None), ("b", 40)), 40, "a", 0, NVML,
                     id="others-report-sm-it-does-not"),
        pytest.param((), 0, "a", 0, NVML, id="nvml-no-process-at-all-is-idle"),
        pytest.param((), 70, "a", 70, DCGM, id="dcgm-only-busy-gpu-busy-share"),
        pytest.param((), 0, "a", 0, DCGM, id="dcgm-only-idle-gpu-idle-share"),
        pytest.param((("b", 40),), 40, "a", 0, DCGM, id="dcgm-with-processes-by-its-own"),
    ],
)  # fmt: skip
def test_share_utilisation(processes, gpu_util: int, job: str, expected: int, source) -> None:
    """A share is as busy as its job's processes on the GPU; a sample whose collector lists no
    processes (dcgm-exporter) cannot tell the shares apart: each is as busy as the GPU."""
    sample = a_sample(
        util_gpu_pct=gpu_util,
        source=source,
        processes=tuple(
            ProcessUsage(i, 1, sm, None if j is None else Owner("vision", "p", "u", j))
            for i, (j, sm) in enumerate(processes)
        ),
    )
    assert share_util(sample, job) == expected


def test_share_idle_flags_survive_duckdb_and_its_segments_per_share(tmp_path) -> None:
    """Through DuckDB: the transactions read back as the in-memory store keeps them (a's legs
    flagged, b's not), sealed into segments and rollups, where the cost report and the Finance
    page's top jobs count a's idle time and money and none of b's."""
    case = CASES["one-share-idle-while-the-other-works"]
    memory = MemoryStore()
    expected = run(case, memory, batched=True)
    with DuckDBStore(tmp_path / "l") as store:
        assert run(case, store, batched=True) == expected
        for m, sm in enumerate(case.minutes):  # read back leg for leg, flags included
            txn_id = minute(m, sm).id
            assert store.find_transaction(txn_id) == memory.find_transaction(txn_id)
        store.seal()
    q = ReportQueries(tmp_path / "l")
    lines = {line.keys[0]: line for line in cost_report(q, ("job_id",)).lines}
    assert lines["a"].idle_gpu_ms == 4 * 30_000  # four confirmed minutes of its half
    assert lines["a"].idle_waste_micros == 4 * 30_000
    assert (lines["b"].idle_gpu_ms, lines["b"].idle_waste_micros) == (0, 0)
    jobs = {j.job_id: j for j in top_jobs(q, Filters())}
    assert (jobs["a"].idle_waste_micros, jobs["b"].idle_waste_micros) == (4 * 30_000, 0)


def test_the_ledgers_share_alert_reclaims_that_share_alone(tmp_path) -> None:
    """The scheduler's own `GpuAssigned` events into the ledger, samples in which one dev share
    does nothing and the other works, the ledger's alerts into the dispatcher: the idle share is
    reclaimed after its queue's 10 minutes, the busy one keeps running; the ledger, given the
    scheduler's `GpuReleased`, resolves the alert as released."""
    rig = Rig(tmp_path)
    store = MemoryStore()
    feed = Feed(store)

    async def scenario() -> None:
        idle_job = await rig.submit(queue="dev", gpu_share=250)
        busy_job = await rig.submit(queue="dev", gpu_share=250)
        for record in (idle_job, busy_job):
            rig.executor.script(record.job_id, RUNS_FOREVER)
        await rig.ticks(2)
        assigned = [e for e in rig.events() if isinstance(e, GpuAssigned)]
        assert {e.job_id for e in assigned} == {idle_job.job_id, busy_job.job_id}
        assert len({share_parent(e.gpu_uuid) for e in assigned}) == 1  # one GPU, two shares
        feed.jobs(*assigned)
        gpu = share_parent(assigned[0].gpu_uuid)
        assert gpu is not None
        start = rig.clock.now_us()
        work = {busy_job.job_id: 70, idle_job.job_id: 0}
        feed.samples(*(minute(m, work, gpu=gpu, start=start) for m in range(5)))
        for message in store.pending_outbox():
            rig.dispatcher.on_alert(message.value)
        store.mark_sent([m.id for m in store.pending_outbox()])
        rig.clock.advance(5 * MINUTE_US)
        await rig.ticks(1)
        assert "JobReclaimed" not in rig.job_events(idle_job.job_id)  # 5 of its 10 minutes
        rig.clock.advance(6 * MINUTE_US)
        await rig.ticks(1)
        assert "JobReclaimed" in rig.job_events(idle_job.job_id)
        assert rig.dispatcher.state.running_job(busy_job.job_id) is not None
        (reclaimed,) = [e for e in rig.events() if isinstance(e, JobReclaimed)]
        assert reclaimed.gpu_uuids == (share_key(gpu, idle_job.job_id),)
        feed.jobs(*(e for e in rig.events() if isinstance(e, GpuReleased)))
        feed.samples(minute(12, {busy_job.job_id: 70}, gpu=gpu, start=start))
        resolved = [decode_alert(m.value) for m in store.pending_outbox() if m.topic == "alerts"]
        assert [(a.subject, a.reason) for a in resolved] == [
            (share_key(gpu, idle_job.job_id), "released")
        ]

    asyncio.run(scenario())


# ------------------------------------------------- a Slurm share before its alias is learned


def alias_minute(m: int, sm: Mapping[str, int]):
    """Minute `m`: one process per key in `sm`; a `slurm:<id>` key names only its Slurm job (a
    collector that read its cgroup), any other key its Tally job with the team."""
    processes = tuple(
        a_process(
            pid=100 + i,
            sm=util,
            owner=Owner(None, None, "u", key)
            if key.startswith("slurm:")
            else an_owner("vision", "p", "u", key),
        )
        for i, (key, util) in enumerate(sorted(sm.items()))
    )
    sample = a_sample(
        gpu_uuid=GPU,
        sample_time_us=T0_US + (m + 1) * MINUTE_US,
        interval_us=MINUTE_US,
        util_gpu_pct=min(100, sum(sm.values())),
        processes=processes,
    )
    return envelope_for(sample, "sim://node-01")


@dataclass(frozen=True)
class AliasCase:
    shares: tuple[str, ...]  # jobs holding 250 ‰ each from T0
    sm: dict[str, int]  # every minute: process key → SM %
    detected: tuple[str, ...]  # the shares the ledger finds idle (from the first minutes)
    known: tuple[tuple[str, str], ...] = ()  # (job, Slurm id) whose JobStarted is folded first


ALIAS_CASES = {
    "busy-under-its-unknown-alias-is-not-idle": AliasCase(("a",), {"slurm:77": 80}, ()),
    "idle-under-its-unknown-alias-is-idle-from-the-start": AliasCase(
        ("a",), {"slurm:77": 0}, ("a",)
    ),
    "an-unknown-alias-beside-a-known-busy-share": AliasCase(
        ("a", "b"), {"slurm:77": 0, "slurm:78": 90}, ("a",), known=(("b", "78"),)
    ),
    "boundary-two-unknown-aliases-one-busy-neither-flagged": AliasCase(
        ("a", "b"), {"slurm:77": 0, "slurm:78": 90}, ()
    ),
    "boundary-two-unknown-aliases-both-idle-both-flagged": AliasCase(
        ("a", "b"), {"slurm:77": 0, "slurm:78": 2}, ("a", "b")
    ),
}


@pytest.mark.parametrize("case", ALIAS_CASES.values(), ids=ALIAS_CASES.keys())
def test_a_slurm_share_is_stepped_from_its_first_sample(case: AliasCase) -> None:
    """A share held by a Slurm job whose processes carry only `slurm:<id>` (its `JobStarted`
    not folded yet) is idle or busy from the first sample after its assignment, by the most
    its possible processes use; it is never flagged idle while one of them may be its and busy."""
    store = MemoryStore()
    feed = Feed(store)
    feed.jobs(*(share_assigned(job, "vision", 250, T0_US) for job in case.shares))
    feed._apply(  # the Slurm ids the jobs topic already said
        "tally.jobs",
        [encode_job_event(JobStarted(j, T0_US, slurm_job_id=s), "s") for j, s in case.known],
    )
    feed.samples(*(alias_minute(m, case.sm) for m in range(5)))
    found = {subject for kind, subject, _ in feed.alerts() if kind == DETECTED}
    assert found == {share_key(GPU, job) for job in case.detected}
    first = store.find_transaction(alias_minute(2, case.sm).id)  # the grace ends in minute 2
    assert first is not None
    assert {p.job_id for p in first.postings if p.idle} == set(case.detected)


@pytest.mark.parametrize(
    ("processes", "aliases", "expected"),
    [
        pytest.param((("slurm:7", 60),), {"slurm:7"}, 60, id="its-possible-alias"),
        pytest.param((("slurm:7", 60), ("slurm:8", 20)), {"slurm:7", "slurm:8"}, 60, id="busiest"),
        pytest.param((("a", 10), ("slurm:7", 60)), {"slurm:7"}, 10, id="its-own-process-wins"),
        pytest.param((("slurm:7", 60),), set(), 0, id="no-alias-unknown"),
    ],
)
def test_share_utilisation_with_unknown_aliases(processes, aliases, expected) -> None:
    sample = a_sample(
        util_gpu_pct=90,
        processes=tuple(
            ProcessUsage(i, 1, sm, Owner(None, None, "u", j) if ":" in j else an_owner(job_id=j))
            for i, (j, sm) in enumerate(processes)
        ),
    )
    assert share_util(sample, "a", aliases) == expected
    assert unresolved(sample, {"a"}) == {j for j, _ in processes if ":" in j}
