"""The pure half of the Slurm executor, table-tested on output recorded from Debian 12's
Slurm 22.05.8 (the test fixture's cluster): sbatch, squeue, sacct (from the job completion
file, `sacct -c`: the same --parsable2 format), scontrol show job, and Slurm's error messages.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from scheduler.executors.errors import (
    ExecutorUnavailable,
    SlurmError,
    SlurmJobUnknown,
    SlurmOutputError,
    SlurmRejected,
)
from scheduler.executors.run_as import OsAccount, RunAs
from scheduler.executors.slurm_text import (
    SLURM_STATES,
    Completed,
    batch_script,
    classify,
    exit_code,
    expand_indices,
    gres_args,
    parse_sacct,
    parse_sbatch,
    parse_scontrol_job,
    parse_squeue,
    sbatch_argv,
    slurm_state,
    time_limit_minutes,
)
from scheduler.model import Flavor, GpuRef, RunningJob
from scheduler.ports import RunState, Work
from tests.scheduler_builders import MINUTE_US, a_spec


def done(argv: str, stdout: str = "", stderr: str = "", rc: int = 0) -> Completed:
    return Completed(tuple(argv.split()), rc, stdout, stderr)


# ---------------------------------------------------------------------------- recorded output

SCONTROL_RUNNING = (
    "JobId=2 JobName=j2 UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901758 Nice=0 "
    "Account=(null) QOS=(null) JobState=RUNNING Reason=None Dependency=(null) Requeue=1 "
    "Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 DerivedExitCode=0:0 RunTime=00:00:00 "
    "TimeLimit=UNLIMITED TimeMin=N/A SubmitTime=2026-11-29T19:14:02 "
    "EligibleTime=2026-11-29T19:14:02 "
    "AccrueTime=2026-11-29T19:14:02 StartTime=2026-11-29T19:14:02 EndTime=Unknown Deadline=N/A "
    "SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-11-29T19:14:02 Scheduler=Main "
    "Partition=debug AllocNode:Sid=vm:3561 ReqNodeList=(null) ExcNodeList=(null) NodeList=tnode "
    "BatchHost=tnode NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* "
    "TRES=cpu=1,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* JOB_GRES=gpu:1   "
    "Nodes=tnode CPU_IDs=1 Mem=0 GRES=gpu:1(IDX:2) MinCPUsNode=1 MinMemoryNode=0 "
    "MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 "
    "Licenses=(null) Network=(null) Command=(null) WorkDir=/tmp/sl StdErr=/tmp/sl/logs/j2.log "
    "StdIn=/dev/null StdOut=/tmp/sl/logs/j2.log Power= TresPerNode=gres:gpu:1 \n"
)
SCONTROL_FAILED = (
    "JobId=1 JobName=j1 UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901759 Nice=0 "
    "Account=(null) QOS=(null) JobState=FAILED Reason=NonZeroExitCode Dependency=(null) "
    "Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=3:0 RunTime=00:00:02 TimeLimit=00:01:00 "
    "TimeMin=N/A SubmitTime=2026-11-29T19:14:02 EligibleTime=2026-11-29T19:14:02 "
    "AccrueTime=2026-11-29T19:14:02 StartTime=2026-11-29T19:14:02 EndTime=2026-11-29T19:14:04 "
    "Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-11-29T19:14:02 "
    "Scheduler=Main Partition=debug AllocNode:Sid=vm:3561 ReqNodeList=(null) ExcNodeList=(null) "
    "NodeList=tnode BatchHost=tnode NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 "
    "ReqB:S:C:T=0:0:*:* TRES=cpu=1,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* "
    "CoreSpec=* MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) "
    "DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) "
    "Command=(null) WorkDir=/tmp/sl StdErr=/tmp/sl/logs/j1.log StdIn=/dev/null "
    "StdOut=/tmp/sl/logs/j1.log Power= TresPerNode=gres:gpu:2 \n"
)
SCONTROL_KILLED = (
    "JobId=3 JobName=sbatch UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901757 "
    "Nice=0 Account=(null) QOS=(null) JobState=FAILED Reason=JobLaunchFailure Dependency=(null) "
    "Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:9 DerivedExitCode=0:0 "
    "RunTime=00:00:00 TimeLimit=UNLIMITED TimeMin=N/A SubmitTime=2026-11-29T19:23:23 "
    "EligibleTime=2026-11-29T19:23:23 AccrueTime=2026-11-29T19:23:23 "
    "StartTime=2026-11-29T19:23:25 EndTime=2026-11-29T19:23:25 Deadline=N/A SuspendTime=None "
    "SecsPreSuspend=0 LastSchedEval=2026-11-29T19:23:25 Scheduler=Main Partition=debug "
    "AllocNode:Sid=vm:3561 ReqNodeList=(null) ExcNodeList=(null) NodeList=tally-node "
    "BatchHost=tally-node NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* "
    "TRES=cpu=1,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* "
    "JOB_GRES=gpu:1   Nodes=tally-node CPU_IDs=2 Mem=0 GRES= MinCPUsNode=1 MinMemoryNode=0 "
    "MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 "
    "Licenses=(null) Network=(null) Command=(null) WorkDir=/work/main StdErr=/tmp/o.log "
    "StdIn=/dev/null StdOut=/tmp/o.log Power= TresPerNode=gres:gpu:1 \n"
)
SCONTROL_REQUEUE_HELD = (
    "JobId=2 JobName=j2 UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=0 Nice=0 "
    "Account=(null) QOS=(null) JobState=PENDING Reason=job_requeued_in_held_state "
    "Dependency=(null) Requeue=1 Restarts=1 BatchFlag=1 Reboot=0 ExitCode=0:0 "
    "DerivedExitCode=0:0 RunTime=00:00:00 TimeLimit=UNLIMITED TimeMin=N/A "
    "SubmitTime=2026-11-29T19:14:02 EligibleTime=2026-11-29T19:16:09 AccrueTime=Unknown "
    "StartTime=2026-11-29T19:16:09 EndTime=2026-11-29T19:16:09 Deadline=N/A\n"
)
SCONTROL_TWO_GPUS_SPLIT = SCONTROL_RUNNING.replace("GRES=gpu:1(IDX:2)", "GRES=gpu:3(IDX:0-1,3)")


@dataclass(frozen=True, slots=True)
class ScontrolCase:
    text: str
    state: str
    run_state: RunState
    exit_code: int | None
    restarts: int
    devices: tuple[str, ...]


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(
            ScontrolCase(SCONTROL_RUNNING, "RUNNING", RunState.RUNNING, 0, 0, ("2",)),
            id="running-one-gpu-idx-2",
        ),
        pytest.param(
            ScontrolCase(SCONTROL_FAILED, "FAILED", RunState.FAILED, 3, 0, ()),
            id="failed-exit-3-no-gres-details-once-ended",
        ),
        pytest.param(
            ScontrolCase(SCONTROL_KILLED, "FAILED", RunState.FAILED, 137, 0, ()),
            id="killed-by-signal-9-empty-gres",
        ),
        pytest.param(
            ScontrolCase(SCONTROL_REQUEUE_HELD, "PENDING", RunState.PENDING, 0, 1, ()),
            id="requeued-and-held",
        ),
        pytest.param(
            ScontrolCase(
                SCONTROL_TWO_GPUS_SPLIT, "RUNNING", RunState.RUNNING, 0, 0, ("0", "1", "3")
            ),
            id="index-ranges-and-lists",
        ),
    ],
)
def test_scontrol_show_job(case: ScontrolCase) -> None:
    row = parse_scontrol_job(done("scontrol --details --oneliner show job 2", case.text))
    assert (row.state, row.run_state, row.exit_code, row.restarts, row.devices) == (
        case.state,
        case.run_state,
        case.exit_code,
        case.restarts,
        case.devices,
    )


def test_scontrol_reads_the_first_jobstate_not_one_inside_free_text() -> None:
    text = SCONTROL_RUNNING.replace("Command=(null)", "Command=/x JobState=COMPLETED")
    assert parse_scontrol_job(done("scontrol show job 2", text)).state == "RUNNING"


def test_scontrol_output_without_a_job_is_an_output_error() -> None:
    with pytest.raises(SlurmOutputError):
        parse_scontrol_job(done("scontrol show job 2", "No jobs in the system\n"))


@pytest.mark.parametrize(
    ("line", "slurm_id", "state", "reason", "run_state"),
    [
        pytest.param("1|RUNNING|None", "1", "RUNNING", "None", RunState.RUNNING, id="running"),
        pytest.param(
            "2|COMPLETING|job requeued in held state",
            "2",
            "COMPLETING",
            "job requeued in held state",
            RunState.RUNNING,
            id="completing-processes-may-live",
        ),
        pytest.param(
            "2|PENDING|job requeued in held state",
            "2",
            "PENDING",
            "job requeued in held state",
            RunState.PENDING,
            id="requeued-held-reason-with-spaces",
        ),
        pytest.param(
            "7|PENDING|BeginTime", "7", "PENDING", "BeginTime", RunState.PENDING, id="begin-time"
        ),
        pytest.param(
            "1|FAILED|NonZeroExitCode",
            "1",
            "FAILED",
            "NonZeroExitCode",
            RunState.FAILED,
            id="failed",
        ),
        pytest.param(
            "3|FAILED|JobLaunchFailure",
            "3",
            "FAILED",
            "JobLaunchFailure",
            RunState.FAILED,
            id="launch-failure",
        ),
        pytest.param("1|COMPLETED|None", "1", "COMPLETED", "None", RunState.FINISHED, id="done"),
        pytest.param(
            "4|CANCELLED|Priority", "4", "CANCELLED", "Priority", RunState.CANCELLED, id="cancelled"
        ),
        pytest.param(
            "6|NODE_FAIL|NodeDown", "6", "NODE_FAIL", "NodeDown", RunState.LOST, id="node-fail"
        ),
    ],
)
def test_squeue_rows(
    line: str, slurm_id: str, state: str, reason: str, run_state: RunState
) -> None:
    rows = parse_squeue(done("squeue --format=%i|%T|%r", line + "\n"))
    row = rows[slurm_id]
    assert (row.state, row.reason, row.run_state) == (state, reason, run_state)


def test_squeue_many_rows_and_blank_lines() -> None:
    text = "4|CANCELLED|Priority\n1|COMPLETED|None\n\n2|FAILED|NonZeroExitCode\n"
    assert sorted(parse_squeue(done("squeue", text))) == ["1", "2", "4"]


def test_squeue_garbage_is_an_output_error() -> None:
    with pytest.raises(SlurmOutputError):
        parse_squeue(done("squeue", "JOBID PARTITION NAME\n"))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            "4|CANCELLED|0:0\n3|FAILED|0:9\n1|COMPLETED|0:0\n2|FAILED|3:0\n",
            {
                "1": ("COMPLETED", 0),
                "2": ("FAILED", 3),
                "3": ("FAILED", 137),
                "4": ("CANCELLED", 0),
            },
            id="recorded-allocations",
        ),
        pytest.param(
            "5|CANCELLED by 0|0:15\n5.batch|CANCELLED|0:15\n5.extern|COMPLETED|0:0\n",
            {"5": ("CANCELLED", 143)},
            id="steps-skipped-cancelled-by-uid",
        ),
        pytest.param("", {}, id="nothing-known"),
    ],
)
def test_sacct_rows(text: str, expected: dict[str, tuple[str, int]]) -> None:
    rows = parse_sacct(done("sacct --parsable2", text))
    assert {k: (r.state, r.exit_code) for k, r in rows.items()} == expected


@pytest.mark.parametrize(
    ("stdout", "expected"),
    [
        pytest.param("10\n", "10", id="plain"),
        pytest.param("10;cluster-a\n", "10", id="with-cluster"),
    ],
)
def test_sbatch_parsable(stdout: str, expected: str) -> None:
    assert parse_sbatch(done("sbatch --parsable", stdout)) == expected


def test_sbatch_without_an_id_is_an_output_error() -> None:
    with pytest.raises(SlurmOutputError):
        parse_sbatch(done("sbatch --parsable", "Submitted batch job\n"))


# ---------------------------------------------------------------------------- states and codes


@pytest.mark.parametrize(
    ("word", "expected"),
    [
        pytest.param("PENDING", RunState.PENDING, id="PENDING"),
        pytest.param("REQUEUE_HOLD", RunState.PENDING, id="REQUEUE_HOLD"),
        pytest.param("RUNNING", RunState.RUNNING, id="RUNNING"),
        pytest.param("COMPLETING", RunState.RUNNING, id="COMPLETING"),
        pytest.param("SUSPENDED", RunState.RUNNING, id="SUSPENDED"),
        pytest.param("COMPLETED", RunState.FINISHED, id="COMPLETED"),
        pytest.param("FAILED", RunState.FAILED, id="FAILED"),
        pytest.param("OUT_OF_MEMORY", RunState.FAILED, id="OUT_OF_MEMORY"),
        pytest.param("CANCELLED", RunState.CANCELLED, id="CANCELLED"),
        pytest.param("CANCELLED by 1000", RunState.CANCELLED, id="CANCELLED-by-uid"),
        pytest.param("CANCELLED+", RunState.CANCELLED, id="CANCELLED-plus-truncated"),
        pytest.param("TIMEOUT", RunState.TIMED_OUT, id="TIMEOUT"),
        pytest.param("DEADLINE", RunState.TIMED_OUT, id="DEADLINE"),
        pytest.param("NODE_FAIL", RunState.LOST, id="NODE_FAIL"),
        pytest.param("BOOT_FAIL", RunState.LOST, id="BOOT_FAIL"),
        pytest.param("PREEMPTED", RunState.LOST, id="PREEMPTED"),
        pytest.param("REVOKED", RunState.LOST, id="REVOKED"),
        pytest.param("SOMETHING_NEW", None, id="unknown-left-alone"),
    ],
)
def test_slurm_state_map(word: str, expected: RunState | None) -> None:
    assert slurm_state(word) is expected


def test_every_mapped_state_has_a_run_state_and_ended_states_are_terminal() -> None:
    ended = {w for w, s in SLURM_STATES.items() if s.ended}
    assert ended == {
        "COMPLETED",
        "FAILED",
        "OUT_OF_MEMORY",
        "CANCELLED",
        "TIMEOUT",
        "DEADLINE",
        "NODE_FAIL",
        "BOOT_FAIL",
        "PREEMPTED",
        "REVOKED",
        "SPECIAL_EXIT",
    }


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("0:0", 0, id="success"),
        pytest.param("3:0", 3, id="exit-3"),
        pytest.param("0:9", 137, id="signal-9"),
        pytest.param("0:15", 143, id="signal-15"),
        pytest.param("", None, id="missing"),
        pytest.param("N/A", None, id="not-applicable"),
    ],
)
def test_exit_codes(text: str, expected: int | None) -> None:
    assert exit_code(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("2", ("2",), id="one"),
        pytest.param("0-1", ("0", "1"), id="range"),
        pytest.param("0-1,3", ("0", "1", "3"), id="range-and-one"),
        pytest.param("", (), id="none"),
    ],
)
def test_gres_indices(text: str, expected: tuple[str, ...]) -> None:
    assert expand_indices(text) == expected


def test_gres_index_garbage_is_refused() -> None:
    with pytest.raises(ValueError, match="not a GRES index list"):
        expand_indices("a-b")


# ---------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("completed", "expected"),
    [
        pytest.param(
            done(
                "sbatch --parsable",
                stderr="sbatch: error: Batch job submission failed: Unable to contact slurm "
                "controller (connect failure)\n",
                rc=1,
            ),
            ExecutorUnavailable,
            id="controller-down",
        ),
        pytest.param(
            done(
                "squeue -h",
                stderr="slurm_load_jobs error: Unable to contact slurm controller "
                "(connect failure)\n",
                rc=1,
            ),
            ExecutorUnavailable,
            id="squeue-controller-down",
        ),
        pytest.param(
            done(
                "sbatch --parsable",
                stderr="sbatch: error: s_p_parse_file: cannot stat file /tmp/nope.conf: No such "
                "file or directory, retrying in 1sec up to 60sec\nsbatch: error: ClusterName "
                "needs to be specified\nsbatch: fatal: Unable to process configuration file\n",
                rc=1,
            ),
            ExecutorUnavailable,
            id="no-configuration",
        ),
        pytest.param(
            done(
                "sbatch --parsable",
                stderr="sbatch: error: Batch job submission failed: Requested node "
                "configuration is not available\n",
                rc=1,
            ),
            SlurmRejected,
            id="too-many-gpus",
        ),
        pytest.param(
            done(
                "sbatch --parsable",
                stderr="sbatch: error: This does not look like a batch script.  The first\n"
                "sbatch: error: line must start with #! followed by the path to an interpreter.\n",
                rc=1,
            ),
            SlurmRejected,
            id="not-a-batch-script",
        ),
        pytest.param(
            done(
                "squeue -j 999",
                stderr="slurm_load_jobs error: Invalid job id specified\n",
                rc=1,
            ),
            SlurmJobUnknown,
            id="squeue-unknown-id",
        ),
        pytest.param(
            done(
                "scontrol release 999",
                stderr="slurm_suspend error: Invalid job id specified\n",
                rc=1,
            ),
            SlurmJobUnknown,
            id="release-unknown-id",
        ),
        pytest.param(
            done(
                "scontrol requeuehold 8",
                stderr="Requested operation is presently disabled for job 8\n",
                rc=1,
            ),
            SlurmError,
            id="requeue-of-a-no-requeue-job",
        ),
        pytest.param(
            done("sacct --parsable2", stderr="Slurm accounting storage is disabled\n", rc=1),
            SlurmError,
            id="sacct-without-slurmdbd",
        ),
    ],
)
def test_classify(completed: Completed, expected: type[Exception]) -> None:
    assert type(classify(completed)) is expected


# ---------------------------------------------------------------------------- building


def running_job(nodes: tuple[str, ...] = ("n1", "n1"), job_id: str = "job-1") -> RunningJob:
    return RunningJob(
        spec=a_spec(job_id, gpus=len(nodes)),
        flavor=Flavor("main", "A100"),
        gpus=tuple(GpuRef(f"GPU-{i}", n) for i, n in enumerate(nodes)),
        priority=0,
        preemptible=True,
        admitted_us=0,
    )


@pytest.mark.parametrize(
    ("nodes", "pin", "expected"),
    [
        pytest.param(("n1", "n1"), False, ["--nodes=1", "--gres=gpu:2"], id="one-node"),
        pytest.param(
            ("n1", "n1", "n2", "n2"), False, ["--nodes=2", "--gres=gpu:2"], id="even-gang"
        ),
        pytest.param(("n1", "n1", "n2"), False, ["--nodes=2", "--gpus=3"], id="uneven-gang"),
        pytest.param(
            ("n1", "n2"), True, ["--nodes=2", "--gres=gpu:1", "--nodelist=n1,n2"], id="pinned"
        ),
    ],
)
def test_gres_args(nodes: tuple[str, ...], pin: bool, expected: list[str]) -> None:
    assert gres_args(running_job(nodes), pin) == expected


@pytest.mark.parametrize(
    ("limit_us", "minutes"),
    [
        pytest.param(1, 1, id="a-microsecond-is-a-minute"),
        pytest.param(MINUTE_US, 1, id="exactly-one"),
        pytest.param(MINUTE_US + 1, 2, id="rounds-up"),
        pytest.param(90 * MINUTE_US, 90, id="ninety"),
    ],
)
def test_time_limit_minutes(limit_us: int, minutes: int) -> None:
    assert time_limit_minutes(limit_us) == minutes


def test_sbatch_argv_exports_names_only_and_escapes_percent_in_the_log_path() -> None:
    work = Work(command=("python", "train.py"), env=(("WANDB_MODE", "a,b=c"),), cwd="/w")
    argv = sbatch_argv(
        running_job(),
        work,
        log_path="/logs/100%.log",
        time_limit_us=61 * 1_000_000,
        partition="gpu",
        extra_args=("--qos=high",),
    )
    assert argv == [
        "sbatch",
        "--parsable",
        "--job-name=job-1",
        "--output=/logs/100%%.log",
        "--open-mode=append",
        "--requeue",
        "--export=ALL,TALLY_JOB_ID,TALLY_ATTEMPT,WANDB_MODE",
        "--nodes=1",
        "--gres=gpu:2",
        "--time=2",
        "--partition=gpu",
        "--chdir=/w",
        "--qos=high",
    ]


ALICE = RunAs("ada", OsAccount("alice", 1001, 1002, "/home/alice", (1002,)))


@pytest.mark.parametrize(
    ("account", "who", "expected"),
    [
        pytest.param(None, None, [], id="neither"),
        pytest.param("vis-gpu", None, ["--account=vis-gpu"], id="team-account"),
        pytest.param(None, ALICE, ["--uid=alice", "--gid=1002"], id="as-root-for-a-user"),
        pytest.param(
            "vis-gpu",
            ALICE,
            ["--account=vis-gpu", "--uid=alice", "--gid=1002"],
            id="both-before-extra-args",
        ),
    ],
)
def test_sbatch_argv_account_and_user(
    account: str | None, who: RunAs | None, expected: list[str]
) -> None:
    argv = sbatch_argv(
        running_job(("n1",)),
        Work(command=("true",)),
        log_path="/l.log",
        time_limit_us=None,
        extra_args=("--qos=high",),
        account=account,
        run_as=who,
    )
    base = argv.index("--gres=gpu:1") + 1
    assert argv[base:] == [*expected, "--qos=high"]


@pytest.mark.parametrize(
    ("work", "expected"),
    [
        pytest.param(
            Work(command=("python", "-c", "print('a b')")),
            "#!/bin/sh\nexec python -c 'print('\"'\"'a b'\"'\"')'\n",
            id="command-quoted",
        ),
        pytest.param(Work(script="#!/bin/bash\necho hi\n"), "#!/bin/bash\necho hi\n", id="script"),
    ],
)
def test_batch_script(work: Work, expected: str) -> None:
    assert batch_script(work) == expected
