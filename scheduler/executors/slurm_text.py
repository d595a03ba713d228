"""The pure half of the Slurm executor: the commands it runs, what their output means, and the
translation of Slurm's failures into `scheduler.executors.errors` — all testable on recorded
output without a cluster.

Commands and the output they are asked for:
    sbatch --parsable ...                    "<id>" or "<id>;<cluster>"
    squeue --noheader --states=all --jobs=… --format=%i|%T|%r
                                             id | long state | reason (may hold spaces)
    sacct --noheader --parsable2 --allocations --jobs=… --format=JobID,State,ExitCode
                                             id | state ("CANCELLED by 0") | "exit:signal"
    scontrol --details --oneliner show job <id>
                                             key=value words; JobState=, Reason=, ExitCode=,
                                             Restarts=, and GRES=gpu:N(IDX:0-1,3) once running

Slurm states → port states (`SLURM_STATES`); a state not in the table parses as None and the
executor leaves the job as it was until Slurm says something it knows:
    PENDING, REQUEUED, REQUEUE_HOLD, REQUEUE_FED, RESV_DEL_HOLD         → PENDING
    CONFIGURING, RUNNING, COMPLETING, SUSPENDED, STOPPED, SIGNALING,
    STAGE_OUT, RESIZING                                                 → RUNNING (processes
                                                                          may still be alive)
    COMPLETED → FINISHED;  FAILED, OUT_OF_MEMORY → FAILED;  CANCELLED → CANCELLED
    TIMEOUT, DEADLINE → TIMED_OUT
    NODE_FAIL, BOOT_FAIL, PREEMPTED, REVOKED, SPECIAL_EXIT → LOST
Exit codes: Slurm's "N:S" is exit status N, or signal S when S > 0 (reported 128 + S).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from ledger.fractional import split_mig_model
from ledger.units import SHARE_UNITS, US_PER_SECOND
from scheduler.executors.errors import (
    ExecutorError,
    ExecutorUnavailable,
    InvalidWork,
    SlurmError,
    SlurmJobUnknown,
    SlurmOutputError,
    SlurmRejected,
)
from scheduler.executors.run_as import RunAs
from scheduler.model import RunningJob
from scheduler.ports import RunState, Work

SLURM_STATES: Mapping[str, RunState] = {
    **dict.fromkeys(
        ("PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"), RunState.PENDING
    ),
    **dict.fromkeys(
        (
            "CONFIGURING",
            "RUNNING",
            "COMPLETING",
            "SUSPENDED",
            "STOPPED",
            "SIGNALING",
            "STAGE_OUT",
            "RESIZING",
        ),
        RunState.RUNNING,
    ),
    "COMPLETED": RunState.FINISHED,
    "FAILED": RunState.FAILED,
    "OUT_OF_MEMORY": RunState.FAILED,
    "CANCELLED": RunState.CANCELLED,
    "TIMEOUT": RunState.TIMED_OUT,
    "DEADLINE": RunState.TIMED_OUT,
    **dict.fromkeys(
        ("NODE_FAIL", "BOOT_FAIL", "PREEMPTED", "REVOKED", "SPECIAL_EXIT"), RunState.LOST
    ),
}

SQUEUE_FORMAT = "%i|%T|%r"
SACCT_FORMAT = "JobID,State,ExitCode"

# stderr that means the cluster, not the job, is the problem
_UNAVAILABLE = re.compile(
    r"Unable to contact slurm controller|Socket timed out|Connection refused|"
    r"Zero Bytes were transmitted|Could not establish a configuration source|"
    r"Unable to process configuration file|Slurm backup controller in standby mode",
    re.IGNORECASE,
)
_UNKNOWN_JOB = re.compile(r"Invalid job id specified", re.IGNORECASE)
SACCT_DISABLED = re.compile(r"accounting storage is disabled|slurmdbd", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Completed:
    """What one Slurm command did."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


class Runner(Protocol):
    """Runs one command to completion; raises `ExecutorUnavailable` when it cannot run it."""

    def __call__(
        self,
        argv: Sequence[str],
        *,
        stdin: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Completed: ...


def classify(done: Completed) -> ExecutorError:
    """The exception a failed Slurm command stands for: the one place stderr is read."""
    if _UNAVAILABLE.search(done.stderr):
        return ExecutorUnavailable(f"{done.argv[0]}: {done.stderr.strip()}")
    if _UNKNOWN_JOB.search(done.stderr):
        return SlurmJobUnknown(done.argv, done.returncode, done.stderr)
    if done.argv[0] == "sbatch":
        return SlurmRejected(done.argv, done.returncode, done.stderr)
    return SlurmError(done.argv, done.returncode, done.stderr)


def checked(done: Completed) -> Completed:
    if done.returncode != 0:
        raise classify(done)
    return done


# ---------------------------------------------------------------------------- parsing


@dataclass(frozen=True, slots=True)
class SlurmRow:
    """One job as squeue, sacct or scontrol report it."""

    slurm_id: str
    state: str  # Slurm's own word, e.g. "CANCELLED"
    reason: str = ""
    exit_code: int | None = None
    restarts: int = 0
    devices: tuple[str, ...] = ()

    @property
    def run_state(self) -> RunState | None:
        return slurm_state(self.state)


def slurm_state(text: str) -> RunState | None:
    """A Slurm job state ("RUNNING", "CANCELLED by 0", "CANCELLED+") as a port state."""
    word = text.strip().split(" ", 1)[0].rstrip("+")
    return SLURM_STATES.get(word)


def exit_code(text: str) -> int | None:
    """Slurm's "N:S" as one exit status: N, or 128 + S when signal S ended it."""
    match = re.fullmatch(r"(\d+):(\d+)", text.strip())
    if match is None:
        return None
    status, sig = int(match[1]), int(match[2])
    return 128 + sig if sig else status


def expand_indices(text: str) -> tuple[str, ...]:
    """GRES indices "0-1,3" as ("0", "1", "3")."""
    out: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise ValueError(f"not a GRES index list: {text!r}")
        out.extend(str(i) for i in range(int(lo), int(hi or lo) + 1))
    return tuple(out)


def parse_sbatch(done: Completed) -> str:
    """The job id `sbatch --parsable` printed."""
    first = done.stdout.strip().splitlines()[0] if done.stdout.strip() else ""
    slurm_id = first.split(";", 1)[0].strip()
    if not slurm_id.isdigit():
        raise SlurmOutputError(done.argv, done.stdout, "sbatch printed no job id")
    return slurm_id


def parse_squeue(done: Completed) -> dict[str, SlurmRow]:
    """Rows of `squeue --format=%i|%T|%r`, by job id."""
    rows: dict[str, SlurmRow] = {}
    for line in done.stdout.splitlines():
        if not line.strip():
            continue
        parts = line.strip().split("|", 2)
        if len(parts) != 3 or not parts[0]:
            raise SlurmOutputError(done.argv, line, "not id|state|reason")
        rows[parts[0]] = SlurmRow(parts[0], parts[1], parts[2])
    return rows


def parse_sacct(done: Completed) -> dict[str, SlurmRow]:
    """Rows of `sacct --parsable2 --format=JobID,State,ExitCode`, allocations only, by id."""
    rows: dict[str, SlurmRow] = {}
    for line in done.stdout.splitlines():
        if not line.strip():
            continue
        parts = line.strip().split("|")
        if len(parts) != 3:
            raise SlurmOutputError(done.argv, line, "not JobID|State|ExitCode")
        job, state, code = parts
        if "." in job:  # a step (batch, extern, 0): the allocation's row speaks for the job
            continue
        rows[job] = SlurmRow(job, state.split(" ", 1)[0], exit_code=exit_code(code))
    return rows


_WORD = re.compile(r"(?:^|\s)(JobId|JobState|Reason|ExitCode|Restarts)=(\S*)")
_GRES_IDX = re.compile(r"(?:^|\s)GRES=gpu(?::[^\s(]*)?\(IDX:([^)]*)\)")


def parse_scontrol_job(done: Completed) -> SlurmRow:
    """`scontrol --details --oneliner show job <id>`: one job's state, exit and GPUs."""
    text = done.stdout
    words: dict[str, str] = {}
    for match in _WORD.finditer(text):
        words.setdefault(match[1], match[2])  # the first: later fields hold free text
    if "JobId" not in words or "JobState" not in words:
        raise SlurmOutputError(done.argv, text, "no JobId= or JobState=")
    devices: list[str] = []
    for match in _GRES_IDX.finditer(text):
        try:
            devices.extend(expand_indices(match[1]))
        except ValueError as exc:
            raise SlurmOutputError(done.argv, text, str(exc)) from exc
    restarts = words.get("Restarts", "0")
    return SlurmRow(
        slurm_id=words["JobId"],
        state=words["JobState"],
        reason=words.get("Reason", ""),
        exit_code=exit_code(words.get("ExitCode", "")),
        restarts=int(restarts) if restarts.isdigit() else 0,
        devices=tuple(devices),
    )


# ---------------------------------------------------------------------------- building


def time_limit_minutes(limit_us: int) -> int:
    """Slurm counts time limits in whole minutes: round up, at least one."""
    minute = 60 * US_PER_SECOND
    return max(1, -(-limit_us // minute))


def batch_script(work: Work) -> str:
    """`Work.script` as is, or its command wrapped in a script that execs it."""
    if work.script is not None:
        return work.script
    return f"#!/bin/sh\nexec {shlex.join(work.command)}\n"


def shards_for(share: int, shards_per_gpu: int) -> int:
    """Slurm shards (`--gres=shard:n`) for a GPU share of `share` per-mille, on GPUs each
    configured with `shards_per_gpu` shards: the share's part of them, rounded up (at least
    one), so a job never gets less of the GPU than it asked for."""
    return max(1, -(-share * shards_per_gpu // SHARE_UNITS))


def gres_args(job: RunningJob, pin_nodes: bool, shards_per_gpu: int | None = None) -> list[str]:
    """GPUs and nodes: `--gres=gpu:N` is per node, so a gang over k nodes asks for k nodes and
    N/k GPUs each when they split evenly, else `--gpus=N` in total. MIG instances are asked
    for by profile, Slurm's MIG gres type: `--gres=gpu:1g.10gb:2` (`--gpus=1g.10gb:N`). A GPU
    share is asked for as Slurm's sharding gres, `--gres=shard:n` on one node (`shards_for`;
    `shards_per_gpu` must then be given). A node is named by its host (a scheduler node label
    `host/model` is one host's GPUs of a flavor)."""
    share = job.spec.gpu_share
    if share is not None:
        if shards_per_gpu is None:
            raise InvalidWork(f"job {job.job_id}: a GPU share needs the shards per GPU")
        hosts = list(dict.fromkeys(g.node.split("/", 1)[0] for g in job.gpus))
        args = ["--nodes=1", f"--gres=shard:{shards_for(share, shards_per_gpu)}"]
        return [*args, f"--nodelist={','.join(hosts)}"] if pin_nodes else args
    per_node: dict[str, int] = {}
    for gpu in job.gpus:
        host = gpu.node.split("/", 1)[0]
        per_node[host] = per_node.get(host, 0) + 1
    profile = split_mig_model(job.flavor.model)[1]
    kind = "" if profile is None else f"{profile}:"
    counts = set(per_node.values())
    if len(counts) == 1:
        args = [f"--nodes={len(per_node)}", f"--gres=gpu:{kind}{counts.pop()}"]
    else:
        args = [f"--nodes={len(per_node)}", f"--gpus={kind}{len(job.gpus)}"]
    if pin_nodes:
        args.append(f"--nodelist={','.join(per_node)}")
    return args


def slurm_path(path: str) -> str:
    """A path for --output: Slurm reads % as a pattern, %% is a literal %."""
    return path.replace("%", "%%")


def sbatch_argv(
    job: RunningJob,
    work: Work,
    *,
    log_path: str,
    time_limit_us: int | None,
    partition: str | None = None,
    pin_nodes: bool = False,
    extra_args: Sequence[str] = (),
    account: str | None = None,
    run_as: RunAs | None = None,
    shards_per_gpu: int | None = None,
) -> list[str]:
    """sbatch for one job; the script comes on stdin. Variables are exported by name only
    (`--export=ALL,TALLY_JOB_ID,…`) with their values in sbatch's environment, so no value
    is ever parsed by Slurm's comma-separated list. `account`: the team's Slurm account
    (`--account=`); `run_as`: the submitter's OS user when the scheduler is root
    (`--uid=<name> --gid=<gid>`: Slurm runs the job as that user); `shards_per_gpu`: the
    shards each GPU has in Slurm's sharding gres, for GPU shares (`gres_args`)."""
    exported = ",".join(["ALL", "TALLY_JOB_ID", "TALLY_ATTEMPT", *(n for n, _ in work.env)])
    argv = [
        "sbatch",
        "--parsable",
        f"--job-name={job.job_id}",
        f"--output={slurm_path(log_path)}",
        "--open-mode=append",
        "--requeue",
        f"--export={exported}",
        *gres_args(job, pin_nodes, shards_per_gpu),
    ]
    if time_limit_us is not None:
        argv.append(f"--time={time_limit_minutes(time_limit_us)}")
    if partition is not None:
        argv.append(f"--partition={partition}")
    if work.cwd is not None:
        argv.append(f"--chdir={work.cwd}")
    if account is not None:
        argv.append(f"--account={account}")
    if run_as is not None:
        argv.extend([f"--uid={run_as.account.name}", f"--gid={run_as.account.gid}"])
    argv.extend(extra_args)
    return argv


def squeue_argv(slurm_ids: Sequence[str]) -> list[str]:
    return [
        "squeue",
        "--noheader",
        "--states=all",
        f"--jobs={','.join(slurm_ids)}",
        f"--format={SQUEUE_FORMAT}",
    ]


def sacct_argv(slurm_ids: Sequence[str]) -> list[str]:
    return [
        "sacct",
        "--noheader",
        "--parsable2",
        "--allocations",
        f"--jobs={','.join(slurm_ids)}",
        f"--format={SACCT_FORMAT}",
    ]


def scontrol_job_argv(slurm_id: str) -> list[str]:
    return ["scontrol", "--details", "--oneliner", "show", "job", slurm_id]
