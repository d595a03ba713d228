"""The Slurm executor beyond the shared contract: preemption as requeue-and-hold and restart as
release of the same Slurm job, holding a job Slurm has not started, cancelling a parked job,
sbatch refusals, jobs ended outside Tally, node failure, time limits, the sacct fallback, many
small jobs, a restarted executor rebuilt from job events cancelling the job its predecessor
submitted, the GPU time of Slurm jobs charged to their teams (a Tally job's process naming only
`SLURM_JOB_ID`; a job submitted outside Tally, by its account, mapped or `unmapped:<account>`) —
against the real single-node Slurm — and its poll logic on a scripted runner.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from collectors.ownership import OwnerResolver
from collectors.slurm_account import SlurmAccounts
from ledger.accounts import consumer_account
from ledger.events import Owner
from ledger.job_events import JobPreempted, JobStarted, JobSubmitted, PreemptReason
from ledger.store.memory import MemoryStore
from ledger.units import Unit
from scheduler.executors.errors import ExecutorUnavailable
from scheduler.executors.slurm import SlurmExecutor, SubprocessRunner
from scheduler.executors.slurm_text import Completed
from scheduler.model import Flavor, GpuRef, RunningJob
from scheduler.ports import JobStatus, RunState, StopReason, Work
from tests.builders import T0_US, a_process, an_envelope
from tests.ledger_harness import Ledger
from tests.scheduler_builders import MINUTE_US, SECOND_US, a_spec
from tests.slurm.cluster import SlurmCluster, processes_with_env
from tests.unit.test_ingest_late_owners import JOBS, SAMPLES

TIMEOUT_S = 20.0
HOLD = Work(command=("/bin/sh", "-c", 'echo "run ${SLURM_RESTART_COUNT:-0}"; sleep 60'))
QUICK = Work(command=("/bin/sh", "-c", "echo quick"))


def a_job(job_id: str, gpus: int = 1, node: str = "tally-node") -> RunningJob:
    return RunningJob(
        spec=a_spec(job_id, gpus=gpus),
        flavor=Flavor("main", "A100"),
        gpus=tuple(GpuRef(f"GPU-{job_id}-{i}", node) for i in range(gpus)),
        priority=0,
        preemptible=True,
        admitted_us=0,
    )


class Watcher:
    """Polls an executor and keeps every status, per job."""

    def __init__(self, executor: SlurmExecutor) -> None:
        self.executor = executor
        self.seen: dict[str, list[JobStatus]] = {}

    def poll(self) -> None:
        for status in self.executor.poll():
            self.seen.setdefault(status.job_id, []).append(status)

    def until(self, job_id: str, state: RunState, after: int = 0) -> JobStatus:
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline:
            self.poll()
            for status in self.seen.get(job_id, [])[after:]:
                if status.state is state:
                    return status
            time.sleep(0.05)
        raise AssertionError(f"{job_id}: no {state} after {after}; saw {self.seen.get(job_id)}")


def squeue(cluster: SlurmCluster, slurm_id: str, fmt: str = "%T") -> str:
    return cluster.run(
        "squeue", "--noheader", "--states=all", f"--jobs={slurm_id}", f"--format={fmt}"
    ).stdout.strip()


def wait_log(path: Path, text: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text():
            return
        time.sleep(0.05)
    raise AssertionError(f"{text!r} not in {path}: {path.read_text() if path.exists() else ''}")


@pytest.fixture
def executor(slurm_cluster: SlurmCluster, tmp_path: Path) -> Iterator[SlurmExecutor]:
    ex = SlurmExecutor(
        tmp_path / "logs", runner=SubprocessRunner(env=slurm_cluster.env), stop_timeout_s=30
    )
    yield ex
    ex.stop([*ex.active(), *ex.parked()], StopReason.CANCELLED)
    slurm_cluster.cancel_all()


# ---------------------------------------------------------------------------- real Slurm


@pytest.mark.slurm
def test_preempt_requeues_and_holds_then_start_releases_the_same_job(
    executor: SlurmExecutor, slurm_cluster: SlurmCluster
) -> None:
    watch = Watcher(executor)
    job = a_job("preempted")
    executor.start(job, HOLD)
    running = watch.until("preempted", RunState.RUNNING)
    slurm_id = executor.slurm_id("preempted")
    assert slurm_id is not None
    assert running.slurm_job_id == slurm_id
    log = executor.log_path("preempted")
    wait_log(log, "run 0")

    (stopped,) = executor.stop(["preempted"], StopReason.PREEMPTED)
    assert stopped.state is RunState.STOPPED
    assert stopped.detail == "preempted: requeued and held"
    assert executor.parked() == ("preempted",)
    assert executor.active() == ()
    assert squeue(slurm_cluster, slurm_id, "%T|%r") == "PENDING|job requeued in held state"

    executor.start(job, HOLD)  # re-admitted: released, not submitted again
    assert executor.slurm_id("preempted") == slurm_id
    again = watch.until("preempted", RunState.RUNNING, after=1)
    wait_log(log, "run 1")
    assert log.read_text().splitlines()[0] == "run 0", "the log is appended, not replaced"
    assert executor.show(slurm_id).restarts == 1

    # a restarted scheduler: a fresh executor rebuilt from what the jobs topic carries
    assert again.slurm_job_id == slurm_id  # published with JobStarted
    events = [
        JobStarted("preempted", 1, slurm_job_id=slurm_id),
        JobPreempted("preempted", "other", PreemptReason.RECLAIM_LENT_QUOTA, 2),
        JobStarted("preempted", 3, slurm_job_id=again.slurm_job_id),
    ]
    fresh = SlurmExecutor(executor.log_dir, runner=executor.run, stop_timeout_s=30)
    assert fresh.rebuild(events) == 1 and fresh.active() == ("preempted",)
    (cancelled,) = fresh.stop(["preempted"], StopReason.CANCELLED)
    assert (cancelled.state, cancelled.native_id) == (RunState.STOPPED, slurm_id)
    assert squeue(slurm_cluster, slurm_id) == "CANCELLED"


@pytest.mark.slurm
def test_preempting_a_job_slurm_has_not_started_holds_it(
    executor: SlurmExecutor, slurm_cluster: SlurmCluster
) -> None:
    watch = Watcher(executor)
    executor.start(a_job("all-gpus", gpus=slurm_cluster.gpus), HOLD)
    watch.until("all-gpus", RunState.RUNNING)
    executor.start(a_job("queued"), QUICK)
    watch.poll()
    queued_id = executor.slurm_id("queued")
    assert queued_id is not None
    assert squeue(slurm_cluster, queued_id) == "PENDING"

    (stopped,) = executor.stop(["queued"], StopReason.PREEMPTED)
    assert stopped.state is RunState.STOPPED
    assert squeue(slurm_cluster, queued_id, "%T|%r").startswith("PENDING|JobHeld")

    executor.stop(["all-gpus"], StopReason.CANCELLED)
    executor.start(a_job("queued"), QUICK)
    assert watch.until("queued", RunState.FINISHED).exit_code == 0


@pytest.mark.slurm
def test_cancelling_a_parked_job_cancels_it_in_slurm(
    executor: SlurmExecutor, slurm_cluster: SlurmCluster
) -> None:
    watch = Watcher(executor)
    executor.start(a_job("parked"), HOLD)
    watch.until("parked", RunState.RUNNING)
    slurm_id = executor.slurm_id("parked")
    assert slurm_id is not None
    executor.stop(["parked"], StopReason.PREEMPTED)
    (cancelled,) = executor.stop(["parked"], StopReason.CANCELLED)
    assert (cancelled.state, cancelled.detail) == (RunState.STOPPED, "cancelled: was parked")
    assert executor.parked() == ()
    assert squeue(slurm_cluster, slurm_id) == "CANCELLED"


@pytest.mark.slurm
def test_a_job_sbatch_refuses_is_reported_failed(
    executor: SlurmExecutor, slurm_cluster: SlurmCluster
) -> None:
    executor.start(a_job("too-big", gpus=slurm_cluster.gpus + 1), QUICK)
    (failed,) = executor.poll()
    assert (failed.state, failed.exit_code) == (RunState.FAILED, None)
    assert "Requested node configuration is not available" in failed.detail
    assert executor.active() == ()


@pytest.mark.slurm
def test_a_job_cancelled_outside_tally_is_reported_cancelled(
    executor: SlurmExecutor, slurm_cluster: SlurmCluster
) -> None:
    watch = Watcher(executor)
    executor.start(a_job("outside"), HOLD)
    watch.until("outside", RunState.RUNNING)
    slurm_id = executor.slurm_id("outside")
    assert slurm_id is not None
    slurm_cluster.run("scancel", slurm_id)
    cancelled = watch.until("outside", RunState.CANCELLED)
    assert cancelled.exit_code == 0  # Slurm records 0:0 for a cancelled batch job
    assert executor.sacct_available is False, "no slurmdbd: scontrol told how it ended"


@pytest.mark.slurm
def test_a_job_slurm_requeues_after_a_node_failure_is_cancelled_and_lost(
    executor: SlurmExecutor, slurm_cluster: SlurmCluster
) -> None:
    watch = Watcher(executor)
    executor.start(a_job("node-fail"), HOLD)
    watch.until("node-fail", RunState.RUNNING)
    wait_log(executor.log_path("node-fail"), "run 0")
    slurm_id = executor.slurm_id("node-fail")
    assert slurm_id is not None
    node = f"nodename={slurm_cluster.node}"
    slurm_cluster.run("scontrol", "update", node, "state=down", "reason=test")
    try:
        lost = watch.until("node-fail", RunState.LOST)
        assert "Slurm requeued it" in lost.detail
        assert squeue(slurm_cluster, slurm_id) == "CANCELLED"
    finally:
        slurm_cluster.run("scontrol", "update", node, "state=resume", check=False)
        slurm_cluster.wait_idle()


@pytest.mark.slurm
def test_the_runtime_limit_becomes_slurms_time_limit(
    executor: SlurmExecutor, slurm_cluster: SlurmCluster
) -> None:
    executor.start(a_job("limited"), HOLD, time_limit_us=MINUTE_US + SECOND_US)
    slurm_id = executor.slurm_id("limited")
    assert slurm_id is not None
    shown = slurm_cluster.run("scontrol", "--oneliner", "show", "job", slurm_id).stdout
    assert " TimeLimit=00:02:00 " in shown


@pytest.mark.slurm
def test_a_gpu_share_runs_on_slurms_shards(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """A quarter GPU on GPUs of `shards_per_gpu` shards asks for `--gres=shard:1`, and Slurm
    runs it: the job sees one GPU of the node."""
    ex = SlurmExecutor(
        tmp_path / "logs",
        runner=SubprocessRunner(env=slurm_cluster.env),
        shards_per_gpu=slurm_cluster.shards_per_gpu,
    )
    job = RunningJob(
        spec=a_spec("share", queue="dev", gpu_share=250),
        flavor=Flavor("main", "A100"),
        gpus=(GpuRef("GPU-share-0/share/share", "tally-node"),),
        priority=0,
        preemptible=True,
        admitted_us=0,
    )
    ex.start(job, Work(command=("/bin/sh", "-c", 'echo "devices=$CUDA_VISIBLE_DEVICES"')))
    slurm_id = ex.slurm_id("share")
    assert slurm_id is not None
    shown = slurm_cluster.run("scontrol", "--oneliner", "show", "job", slurm_id).stdout
    assert "shard:1" in shown
    wait_log(ex.log_path("share"), "devices=")
    devices = ex.log_path("share").read_text().split("devices=", 1)[1].strip()
    assert devices.isdigit(), devices  # one GPU, by index


# A Tally job whose worker process has only Slurm's variables (as under srun or an MPI launcher
# that does not pass TALLY_JOB_ID on), then a batch job submitted outside Tally.
LAUNCHED = Work(command=("/bin/sh", "-c", "env -u TALLY_JOB_ID sleep 60 & echo launched; wait"))


def _sbatch(cluster: SlurmCluster, account: str) -> str:
    """A one-GPU batch job submitted straight to Slurm under `account`; its Slurm id."""
    argv = ("sbatch", "--parsable", f"--account={account}", "--gres=gpu:1", "--output=/dev/null")
    return cluster.run(*argv, "--wrap=sleep 60").stdout.strip().split(";")[0]


@pytest.mark.slurm
def test_gpu_time_of_slurm_jobs_is_charged_to_their_teams(
    executor: SlurmExecutor, slurm_cluster: SlurmCluster
) -> None:
    """The charge path on real Slurm processes: the owner resolver reads each job's processes
    (`/proc/<pid>/environ`), the ledger folds a 10 s sample per process. A Tally job's process
    that names only `SLURM_JOB_ID` is charged, through the `JobStarted` carrying its Slurm id, to
    the Tally job's team; a job sbatch'ed outside Tally to its account's team, and an account
    the config does not name to the visible team `unmapped:<account>`."""
    watch = Watcher(executor)
    executor.start(a_job("launched"), LAUNCHED)
    watch.until("launched", RunState.RUNNING)
    wait_log(executor.log_path("launched"), "launched")
    tally_id = executor.slurm_id("launched")
    assert tally_id is not None
    outside = {a: _sbatch(slurm_cluster, a) for a in ("ml-research", "nobody-knows")}
    scontrol = ("env", f"SLURM_CONF={slurm_cluster.conf}", "scontrol")
    resolver = OwnerResolver(
        slurm_account=SlurmAccounts(scontrol),
        accounts={"ml-research": ("language", "language-project")},
    )

    def owners_of(slurm_id: str) -> dict[int, Owner | None]:
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline:
            pids = processes_with_env("SLURM_JOB_ID", slurm_id)
            owners = {pid: resolver(pid, "GPU-0") for pid in pids}
            if any(o is not None and o.job_id == f"slurm:{slurm_id}" for o in owners.values()):
                return owners
            time.sleep(0.05)
        raise AssertionError(f"no process of Slurm job {slurm_id} names it")

    launched = owners_of(tally_id)
    worker = [o for o in launched.values() if o is not None and o.job_id == f"slurm:{tally_id}"]
    assert worker and all(o.team is None for o in worker)  # the ledger must resolve it
    mapped = owners_of(outside["ml-research"])
    unknown = owners_of(outside["nobody-knows"])

    ledger = Ledger(MemoryStore(), strict=True)
    started = JobStarted("launched", T0_US + 1, slurm_job_id=tally_id)
    ledger.feed(JOBS, (JobSubmitted(a_spec("launched"), T0_US), started))
    samples = [
        an_envelope(gpu_uuid=f"GPU-{n}", processes=(a_process(pid, owner=owner),))
        for n, (pid, owner) in enumerate([*launched.items(), *mapped.items(), *unknown.items()])
        if owner is not None and owner.job_id is not None and owner.job_id.startswith("slurm:")
    ]
    ledger.feed(SAMPLES, samples)
    by_job = {}
    for row in ledger.store.balance_rows():
        if row.unit == Unit.GPU_MS and row.account.startswith("consumer:"):
            by_job[row.account] = by_job.get(row.account, 0) + row.balance
    ten_s = 10_000  # GPU-ms of one 10 s sample
    every = [*launched.values(), *mapped.values(), *unknown.values()]
    count = Counter(o.job_id for o in every if o is not None)
    assert by_job == {
        consumer_account("vision", "vision-project"): ten_s * count[f"slurm:{tally_id}"],
        consumer_account("language", "language-project"): ten_s
        * count[f"slurm:{outside['ml-research']}"],
        consumer_account("unmapped:nobody-knows", None): ten_s
        * count[f"slurm:{outside['nobody-knows']}"],
    }


@pytest.mark.slurm
def test_many_small_jobs_finish_in_seconds(executor: SlurmExecutor) -> None:
    watch = Watcher(executor)
    ids = [f"small-{n}" for n in range(32)]
    started = time.monotonic()
    for job_id in ids:
        executor.start(a_job(job_id), QUICK)
    for job_id in ids:
        assert watch.until(job_id, RunState.FINISHED).exit_code == 0
    assert time.monotonic() - started < 20


# ---------------------------------------------------------------------------- scripted runner


class ScriptedRunner:
    """Answers each command by its first two words, from recorded output."""

    def __init__(self, answers: Mapping[str, Sequence[Completed]]) -> None:
        self.answers = {k: list(v) for k, v in answers.items()}
        self.calls: list[tuple[str, ...]] = []

    def __call__(
        self,
        argv: Sequence[str],
        *,
        stdin: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Completed:
        self.calls.append(tuple(argv))
        key = " ".join(argv[:2]) if argv[0] == "scontrol" else argv[0]
        queue = self.answers.get(key)
        assert queue, f"unexpected command {argv}"
        return queue.pop(0) if len(queue) > 1 else queue[0]


def ok(argv: str, stdout: str) -> Completed:
    return Completed(tuple(argv.split()), 0, stdout, "")


def test_a_job_slurm_forgot_is_reported_lost(tmp_path: Path) -> None:
    runner = ScriptedRunner(
        {
            "sbatch": [ok("sbatch", "41\n")],
            "squeue": [ok("squeue", "41|RUNNING|None\n"), ok("squeue", "")],
            "scontrol --details": [
                ok("scontrol", "JobId=41 JobState=RUNNING GRES=gpu:1(IDX:0)\n"),
                Completed(("scontrol",), 1, "", "slurm_load_jobs error: Invalid job id specified"),
            ],
            "sacct": [Completed(("sacct",), 1, "", "Slurm accounting storage is disabled\n")],
        }
    )
    ex = SlurmExecutor(tmp_path, runner=runner)
    ex.start(a_job("gone"), QUICK)
    (running,) = ex.poll()
    assert (running.state, running.devices, running.native_id) == (RunState.RUNNING, ("0",), "41")
    assert running.slurm_job_id == "41"  # SLURM_JOB_ID=41 in its processes: owner slurm:41
    (lost,) = ex.poll()
    assert (lost.state, lost.detail) == (RunState.LOST, "Slurm no longer knows the job")
    assert ex.sacct_available is False


def test_sacct_tells_how_a_job_ended_where_accounting_runs(tmp_path: Path) -> None:
    runner = ScriptedRunner(
        {
            "sbatch": [ok("sbatch", "42;cluster\n")],
            "squeue": [ok("squeue", "42|TIMEOUT|TimeLimit\n")],
            "scontrol --details": [ok("scontrol", "JobId=42 JobState=TIMEOUT GRES=\n")],
            "sacct": [ok("sacct", "42|TIMEOUT|0:15\n42.batch|CANCELLED|0:15\n")],
        }
    )
    ex = SlurmExecutor(tmp_path, runner=runner)
    ex.start(a_job("slow"), HOLD, time_limit_us=MINUTE_US)
    running, timed_out = ex.poll()
    assert running.state is RunState.RUNNING
    assert (timed_out.state, timed_out.exit_code) == (RunState.TIMED_OUT, 143)
    assert ex.sacct_available is True
    assert [c[0] for c in runner.calls] == ["sbatch", "squeue", "scontrol", "sacct"]


def test_a_missing_slurm_binary_is_executor_unavailable(tmp_path: Path) -> None:
    ex = SlurmExecutor(tmp_path, runner=SubprocessRunner(env={"PATH": str(tmp_path)}))
    with pytest.raises(ExecutorUnavailable, match="sbatch is not installed"):
        ex.start(a_job("nowhere"), QUICK)
