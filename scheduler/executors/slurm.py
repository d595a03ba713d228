"""The Slurm executor: each Tally job is one Slurm batch job with `--gres=gpu:N`; Tally decides,
Slurm runs. Parsing and command building live in `scheduler.executors.slurm_text`.

What each order becomes:
- start     sbatch --parsable --job-name=<job id> --gres=gpu:N --output=<log> (appended)
            --requeue --export=ALL,TALLY_JOB_ID,TALLY_ATTEMPT[,Work.env names] [--time=<min>]
            [--account=<the team's account>] [--uid=<user> --gid=<gid>, as root, for the
            submitter's OS user: `scheduler.executors.run_as`; a job that may not run as its
            submitter is reported FAILED by the next poll, never submitted]; the script comes
            on stdin. A GPU share asks for Slurm's sharding gres instead, `--gres=shard:n`
            (n: its per-mille of `shards_per_gpu`, rounded up; `slurm_text.gres_args`); with
            no `shards_per_gpu` it is reported FAILED, never submitted. A job that was
            preempted (parked, below) is restarted instead: `scontrol update StartTime=now`
            (a requeued job is otherwise not eligible for ~120 s) and `scontrol release`, so
            it is the same Slurm job, with SLURM_RESTART_COUNT telling it so;
- stop      PREEMPTED: `scontrol requeuehold` a running job (`scontrol hold` one Slurm has
            not started yet) and park it; any other reason: `scancel`. Either way `stop`
            waits until squeue shows none of the jobs RUNNING or COMPLETING (their processes
            are gone) or raises `StopTimeout`;
- poll      one `squeue --states=all` for every job started here; a job first seen running
            gets its GPUs from `scontrol --details show job` (GRES IDX); an ended job gets
            its exit code from `sacct`, or — without slurmdbd, where sacct answers "accounting
            storage is disabled" — from `scontrol show job`, which knows a job for MinJobAge
            (300 s by default) after it ends. A job Slurm no longer knows is reported LOST.

After a restart, `rebuild` takes back the jobs the `jobs` topic shows running or parked
(`scheduler.executors.slurm_ids`: each `JobStarted` carries the Slurm job id, from the RUNNING
status), so a restarted scheduler still polls, cancels and restarts the Slurm jobs it submitted.

Invariants:
- Slurm never reruns a job on its own: one that Slurm requeued (node failure) is cancelled and
  reported LOST, and the core decides whether it runs again;
- a restart waits until at least `restart_gap_s` after the requeue: slurmd revokes a requeued
  job's credential with one-second resolution, and a restart within that second is killed
  ("Job credential revoked") and ends FAILED;
- `CUDA_VISIBLE_DEVICES` is what Slurm's gres gives the job; the devices it chose come back in
  the RUNNING status. Tally's GPU UUIDs decide how many GPUs and, with `pin_nodes`, which
  nodes; which devices on a node is Slurm's choice.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from scheduler.executors.errors import (
    ExecutorUnavailable,
    JobAlreadyStarted,
    SlurmError,
    SlurmJobUnknown,
    SlurmRejected,
    StopTimeout,
)
from scheduler.executors.launch import log_file, tally_env
from scheduler.executors.local import WallClock
from scheduler.executors.run_as import NO_OS_USERS, OsUsers, Refusal, decide
from scheduler.executors.slurm_ids import slurm_jobs
from scheduler.executors.slurm_text import (
    SACCT_DISABLED,
    Completed,
    Runner,
    SlurmRow,
    batch_script,
    checked,
    parse_sacct,
    parse_sbatch,
    parse_scontrol_job,
    parse_squeue,
    sacct_argv,
    sbatch_argv,
    scontrol_job_argv,
    squeue_argv,
)
from scheduler.model import RunningJob
from scheduler.ports import (
    Clock,
    Executor,
    JobStatus,
    RebuildsFromTopic,
    RunState,
    StopReason,
    Work,
)

# Slurm states in which a job's processes may still be alive
BUSY = frozenset(("CONFIGURING", "RUNNING", "COMPLETING", "SIGNALING", "STAGE_OUT", "RESIZING"))


class SubprocessRunner:
    """Runs Slurm's commands with `env` over this process's environment (e.g. SLURM_CONF)."""

    def __init__(self, env: Mapping[str, str] | None = None, timeout_s: float = 30.0) -> None:
        self.env = dict(env or {})
        self.timeout_s = timeout_s

    def __call__(
        self,
        argv: Sequence[str],
        *,
        stdin: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Completed:
        merged = {**os.environ, **self.env, **(env or {})}
        try:
            done = subprocess.run(
                list(argv),
                input=stdin,
                capture_output=True,
                text=True,
                env=merged,
                timeout=self.timeout_s,
                check=False,
            )
        except FileNotFoundError as exc:
            raise ExecutorUnavailable(f"{argv[0]} is not installed: {exc}") from exc
        except subprocess.TimeoutExpired as exc:
            raise ExecutorUnavailable(f"{argv[0]} timed out after {self.timeout_s:g} s") from exc
        return Completed(tuple(argv), done.returncode, done.stdout, done.stderr)


@dataclass(slots=True)
class _Track:
    job_id: str
    slurm_id: str
    reported_running: bool = False
    seen_running: bool = False
    devices: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class _Parked:
    slurm_id: str
    since: float  # time.monotonic() when its processes were gone


class SlurmExecutor:
    """Runs each job as a Slurm batch job; see the module. `accounts`: team → Slurm account;
    `os_users`: the submitter → OS user mapping (`identity.os_users`)."""

    def __init__(
        self,
        log_dir: Path,
        *,
        runner: Runner | None = None,
        partition: str | None = None,
        pin_nodes: bool = False,
        extra_args: Sequence[str] = (),
        stop_timeout_s: float = 120.0,
        restart_gap_s: float = 1.1,
        interval_s: float = 0.1,
        clock: Clock | None = None,
        accounts: Mapping[str, str] | None = None,
        os_users: OsUsers = NO_OS_USERS,
        shards_per_gpu: int | None = None,
    ) -> None:
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.accounts = dict(accounts or {})
        self.os_users = os_users
        self.run: Runner = runner or SubprocessRunner()
        self.partition = partition
        self.pin_nodes = pin_nodes
        self.shards_per_gpu = shards_per_gpu
        self.extra_args = tuple(extra_args)
        self.stop_timeout_s = stop_timeout_s
        self.restart_gap_s = restart_gap_s
        self.interval_s = interval_s
        self.clock: Clock = clock or WallClock()
        self.sacct_available: bool | None = None  # None: not tried yet
        self._tracks: dict[str, _Track] = {}
        self._parked: dict[str, _Parked] = {}
        self._reports: list[JobStatus] = []

    # ------------------------------------------------------------------ the port

    def start(self, job: RunningJob, work: Work, *, time_limit_us: int | None = None) -> None:
        if job.job_id in self._tracks:
            raise JobAlreadyStarted(f"job {job.job_id} is already running here")
        parked = self._parked.get(job.job_id)
        if parked is not None:
            self._restart(job.job_id, parked)
            return
        who = decide(self.os_users, job.spec.user)
        if isinstance(who, Refusal):
            detail = f"refused to start: {who.reason}"  # 126, as the local executor says
            self._reports.append(
                JobStatus(job.job_id, RunState.FAILED, self._now(), 126, (), "", detail)
            )
            return
        if job.spec.gpu_share is not None and self.shards_per_gpu is None:
            detail = "a GPU share needs Slurm's sharding gres: set scheduler.slurm.shards_per_gpu"
            self._reports.append(
                JobStatus(job.job_id, RunState.FAILED, self._now(), None, (), "", detail)
            )
            return
        argv = sbatch_argv(
            job,
            work,
            log_path=str(self.log_path(job.job_id)),
            time_limit_us=time_limit_us,
            partition=self.partition,
            pin_nodes=self.pin_nodes,
            extra_args=self.extra_args,
            account=self.accounts.get(job.team),
            run_as=who,
            shards_per_gpu=self.shards_per_gpu,
        )
        env = {**tally_env(job), **dict(work.env)}
        try:
            done = checked(self.run(argv, stdin=batch_script(work), env=env))
        except SlurmRejected as exc:
            detail = f"sbatch refused the job: {exc.stderr}"
            self._reports.append(
                JobStatus(job.job_id, RunState.FAILED, self._now(), None, (), "", detail)
            )
            return
        self._tracks[job.job_id] = _Track(job.job_id, parse_sbatch(done))

    def stop(self, job_ids: Collection[str], reason: StopReason) -> tuple[JobStatus, ...]:
        wanted = list(dict.fromkeys(job_ids))
        statuses: list[JobStatus] = []
        for job_id in wanted:  # parked jobs have no processes: cancel or leave them
            parked = self._parked.get(job_id)
            if parked is not None and reason is not StopReason.PREEMPTED:
                self._cancel([parked.slurm_id])
                del self._parked[job_id]
                statuses.append(self._stopped(job_id, parked.slurm_id, reason, "was parked"))
        tracks = [self._tracks[j] for j in wanted if j in self._tracks]
        if not tracks:
            return tuple(statuses)
        rows = self._squeue([t.slurm_id for t in tracks])
        live: list[_Track] = []
        for track in tracks:
            row = rows.get(track.slurm_id)
            state = None if row is None else row.run_state
            if row is None or (state is not None and state.ended):
                statuses.append(self._ended(track, row))  # it ended on its own first
                del self._tracks[track.job_id]
            else:
                live.append(track)
        if reason is StopReason.PREEMPTED:
            started = [t for t in live if rows[t.slurm_id].run_state is RunState.RUNNING]
            queued = [t for t in live if t not in started]
            self._scontrol("requeuehold", [t.slurm_id for t in started])
            self._scontrol("hold", [t.slurm_id for t in queued])
        else:
            self._cancel([t.slurm_id for t in live])
        self._wait_idle(live, reason)
        for track in live:
            del self._tracks[track.job_id]
            if reason is StopReason.PREEMPTED:
                self._parked[track.job_id] = _Parked(track.slurm_id, time.monotonic())
            how = "requeued and held" if reason is StopReason.PREEMPTED else "cancelled"
            statuses.append(self._stopped(track.job_id, track.slurm_id, reason, how, track))
        return tuple(statuses)

    def poll(self) -> tuple[JobStatus, ...]:
        out, self._reports = self._reports, []
        if not self._tracks:
            return tuple(out)
        rows = self._squeue([t.slurm_id for t in self._tracks.values()])
        for track in list(self._tracks.values()):
            row = rows.get(track.slurm_id)
            state = None if row is None else row.run_state
            if row is None or (state is not None and state.ended):
                if not track.reported_running:  # too short to be seen running
                    out.append(self._running(track))
                out.append(self._ended(track, row))
                del self._tracks[track.job_id]
            elif state is RunState.RUNNING:
                track.seen_running = True
                if not track.reported_running:
                    out.append(self._running(track))
            elif state is RunState.PENDING and track.seen_running:
                # Slurm requeued it on its own (node failure): Tally decides, not Slurm
                self._cancel([track.slurm_id])
                del self._tracks[track.job_id]
                detail = f"Slurm requeued it ({row.reason}); cancelled"
                out.append(self._status(track, RunState.LOST, None, detail))
        return tuple(out)

    def active(self) -> tuple[str, ...]:
        return tuple(self._tracks)

    def rebuild(self, events: Iterable[object]) -> int:
        """After a restart: take back the jobs `events` (the replayed `jobs` topic) show
        running or parked in Slurm; how many. A running one is not reported RUNNING again."""
        found = slurm_jobs(events)
        for job_id, slurm_id in found.running.items():
            if job_id not in self._tracks:
                self._tracks[job_id] = _Track(job_id, slurm_id, True, True)
        for job_id, slurm_id in found.parked.items():
            if job_id not in self._parked:  # parked long ago: no gap to wait out
                self._parked[job_id] = _Parked(slurm_id, time.monotonic() - self.restart_gap_s)
        return len(found.running) + len(found.parked)

    def log_path(self, job_id: str) -> Path:
        return log_file(self.log_dir, job_id)

    # ------------------------------------------------------------------ Slurm verbs

    def slurm_id(self, job_id: str) -> str | None:
        """The Slurm job id of a job started (or parked) here."""
        track = self._tracks.get(job_id)
        if track is not None:
            return track.slurm_id
        parked = self._parked.get(job_id)
        return None if parked is None else parked.slurm_id

    def parked(self) -> tuple[str, ...]:
        """Preempted jobs held in Slurm's queue until they are started again."""
        return tuple(self._parked)

    def hold(self, slurm_ids: Sequence[str]) -> None:
        self._scontrol("hold", slurm_ids)

    def release(self, slurm_ids: Sequence[str]) -> None:
        self._scontrol("release", slurm_ids)

    def requeue(self, slurm_ids: Sequence[str], *, hold: bool = False) -> None:
        self._scontrol("requeuehold" if hold else "requeue", slurm_ids)

    def show(self, slurm_id: str) -> SlurmRow:
        """`scontrol show job`: what slurmctld knows of one job."""
        return parse_scontrol_job(checked(self.run(scontrol_job_argv(slurm_id))))

    # ------------------------------------------------------------------ helpers

    def _now(self) -> int:
        return self.clock.now_us()

    def _scontrol(self, verb: str, slurm_ids: Sequence[str]) -> None:
        if slurm_ids:
            checked(self.run(["scontrol", verb, ",".join(slurm_ids)]))

    def _cancel(self, slurm_ids: Sequence[str]) -> None:
        if slurm_ids:
            checked(self.run(["scancel", *slurm_ids]))

    def _restart(self, job_id: str, parked: _Parked) -> None:
        wait = parked.since + self.restart_gap_s - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        self._scontrol_update(parked.slurm_id, "StartTime=now")
        self.release([parked.slurm_id])
        del self._parked[job_id]
        self._tracks[job_id] = _Track(job_id, parked.slurm_id)

    def _scontrol_update(self, slurm_id: str, setting: str) -> None:
        checked(self.run(["scontrol", "update", f"JobId={slurm_id}", setting]))

    def _squeue(self, slurm_ids: Sequence[str]) -> dict[str, SlurmRow]:
        try:
            return parse_squeue(checked(self.run(squeue_argv(slurm_ids))))
        except SlurmJobUnknown:  # squeue fails when the only job asked for is unknown
            return {}

    def _wait_idle(self, tracks: Sequence[_Track], reason: StopReason) -> None:
        ids = [t.slurm_id for t in tracks]
        deadline = time.monotonic() + self.stop_timeout_s
        while ids:
            rows = self._squeue(ids)
            ids = [i for i in ids if i in rows and rows[i].state in BUSY]
            if not ids:
                return
            if time.monotonic() >= deadline:
                stuck = [t.job_id for t in tracks if t.slurm_id in ids]
                raise StopTimeout(
                    f"Slurm jobs {', '.join(ids)} still running {self.stop_timeout_s:g} s "
                    f"after {reason.value}",
                    stuck,
                )
            time.sleep(self.interval_s)

    def _running(self, track: _Track) -> JobStatus:
        try:
            track.devices = self.show(track.slurm_id).devices
        except SlurmError:
            track.devices = ()  # it ended between squeue and scontrol: no devices to report
        track.reported_running = True
        return JobStatus(
            track.job_id,
            RunState.RUNNING,
            self._now(),
            None,
            track.devices,
            track.slurm_id,
            slurm_job_id=track.slurm_id,
        )

    def _final(self, slurm_id: str) -> SlurmRow | None:
        """How an ended job ended: sacct where accounting runs, else scontrol."""
        if self.sacct_available is not False:
            try:
                rows = parse_sacct(checked(self.run(sacct_argv([slurm_id]))))
                self.sacct_available = True
                if slurm_id in rows:
                    return rows[slurm_id]
            except SlurmError as exc:
                if SACCT_DISABLED.search(exc.stderr):
                    self.sacct_available = False
        try:
            return self.show(slurm_id)
        except SlurmJobUnknown:
            return None

    def _ended(self, track: _Track, row: SlurmRow | None) -> JobStatus:
        """How an ended (or vanished) job ended."""
        final = self._final(track.slurm_id)
        if final is None or final.run_state is None or not final.run_state.ended:
            seen = "" if row is None else f" (last seen {row.state})"
            return self._status(track, RunState.LOST, None, f"Slurm no longer knows the job{seen}")
        state = final.run_state
        code = 0 if state is RunState.FINISHED else final.exit_code
        detail = "" if state is RunState.FINISHED else f"Slurm: {final.state} {final.reason}"
        return self._status(track, state, code, detail.strip())

    def _status(self, track: _Track, state: RunState, code: int | None, detail: str) -> JobStatus:
        return JobStatus(track.job_id, state, self._now(), code, (), track.slurm_id, detail)

    def _stopped(
        self,
        job_id: str,
        slurm_id: str,
        reason: StopReason,
        how: str,
        track: _Track | None = None,
    ) -> JobStatus:
        devices = () if track is None else track.devices
        detail = f"{reason.value}: {how}"
        return JobStatus(job_id, RunState.STOPPED, self._now(), None, devices, slurm_id, detail)


if TYPE_CHECKING:
    _conforms: Executor = SlurmExecutor(Path())
    _rebuilds: RebuildsFromTopic = SlurmExecutor(Path())
