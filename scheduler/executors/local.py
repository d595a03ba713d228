"""The local executor: each job is a process group on this machine, pinned to its GPUs with
`CUDA_VISIBLE_DEVICES`. The embedded default.

Invariants:
- a job runs as the leader of its own session and process group (`start_new_session`), with
  stdin from /dev/null and stdout and stderr appended to its log file; `Work.script` runs from
  a file beside the log (mode 0700) so its #! line picks the interpreter;
- a job ends when its leader exits; whatever is left of its group is killed with SIGKILL at
  once, so no process of an ended job keeps its GPUs;
- `stop` sends SIGTERM to every group it stops, waits one grace period for all of them, then
  SIGKILLs the survivors; it returns once no process of those groups is alive, or raises
  `StopTimeout` (a process stuck in the kernel) naming the jobs whose GPUs are not free;
- `start` may be called from several threads at once for different jobs (up to
  `concurrent_starts`, `scheduler.enactment`): each touches only its own run, log and script;
  `poll`, `stop` and `active` are never called during starts;
- every leader is reaped (`Popen.poll`/`wait`), so no job leaves a zombie behind; children a
  job orphans are reparented to init, which reaps them;
- a command that cannot be executed (missing, not executable, bad working directory) is not an
  exception: the next `poll` reports it `FAILED` with exit code 127 (not found) or 126 (cannot
  execute), the shell's conventions, and the reason in its detail and log;
- exit statuses: 0 → FINISHED; n > 0 → FAILED with n; killed by signal N that no stop sent →
  FAILED with 128 + N;
- a job runs as its submitter's OS user (`scheduler.executors.run_as`, `identity.os_users`):
  as root the child drops to it (initgroups, setgid, setuid) before exec, with HOME, USER and
  LOGNAME set for it, and its script file is chowned to it; a job that may not run as its
  submitter (not root and another user, unmapped, unknown) is not started: the next `poll`
  reports it FAILED with exit code 126 and the refusal as its detail.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scheduler.executors.errors import ExecutorUnavailable, JobAlreadyStarted, StopTimeout
from scheduler.executors.launch import job_environment, log_file, log_name, visible_devices
from scheduler.executors.processes import alive_groups, signal_group, wait_until
from scheduler.executors.run_as import NO_OS_USERS, OsUsers, Refusal, RunAs, decide
from scheduler.model import RunningJob
from scheduler.ports import (
    Clock,
    Executor,
    JobStatus,
    KnowsProcessGroups,
    PollsCheaply,
    RunState,
    StartsConcurrently,
    StopReason,
    Work,
)


class WallClock:
    def now_us(self) -> int:
        return time.time_ns() // 1000


@dataclass(slots=True)
class _Run:
    job_id: str
    proc: subprocess.Popen[bytes]
    started_us: int
    devices: tuple[str, ...]
    reported_running: bool = False

    @property
    def pgid(self) -> int:
        return self.proc.pid  # the leader of its own group


def exit_status(returncode: int) -> tuple[RunState, int]:
    """A `Popen.returncode` as the port's state and exit code (128 + N for signal N)."""
    if returncode == 0:
        return RunState.FINISHED, 0
    if returncode < 0:
        return RunState.FAILED, 128 - returncode
    return RunState.FAILED, returncode


def _signal_name(exit_code: int) -> str:
    try:
        return signal.Signals(exit_code - 128).name
    except ValueError:
        return f"signal {exit_code - 128}"


def _credentials(who: RunAs | None) -> dict[str, Any]:
    """`Popen`'s user, group and supplementary groups: the child sets them before exec."""
    if who is None:
        return {}
    account = who.account
    return {"user": account.uid, "group": account.gid, "extra_groups": list(account.groups)}


def _launch_failure(exc: OSError) -> int:
    return 127 if exc.errno == errno.ENOENT else 126


class LocalExecutor:
    """Runs jobs as process groups on this machine; see the module's invariants.

    `device_ids` maps GPU UUIDs to what `CUDA_VISIBLE_DEVICES` should say (indices such as
    "0"); unmapped GPUs appear by UUID. It is read at each start, so a mapping that changes
    (the inventory's) is followed. `env`: the environment jobs start from (default: this
    process's environment when the job starts). `os_users`: the submitter → OS user mapping
    (`identity.os_users`); none: every job runs as this process's user. `concurrent_starts`:
    how many starts an enactment may run at once (each waits for its child's exec). Its
    `poll` asks only its own children (`PollsCheaply`): an enactment polls it right after its
    starts.
    """

    polls_cheaply = True

    def __init__(
        self,
        log_dir: Path,
        *,
        device_ids: Mapping[str, str] | None = None,
        grace_s: float = 10.0,
        kill_timeout_s: float = 5.0,
        env: Mapping[str, str] | None = None,
        clock: Clock | None = None,
        os_users: OsUsers = NO_OS_USERS,
        concurrent_starts: int = 8,
    ) -> None:
        self.concurrent_starts = concurrent_starts
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.device_ids: Mapping[str, str] = device_ids if device_ids is not None else {}
        self.grace_s = grace_s
        self.kill_timeout_s = kill_timeout_s
        self.env = None if env is None else dict(env)
        self.clock: Clock = clock or WallClock()
        self.os_users = os_users
        self._runs: dict[str, _Run] = {}
        self._reports: list[JobStatus] = []
        # the bytes of this process's environment as last seen (`_base_environment`)
        self._environ: dict[bytes, bytes] | None = None

    # ------------------------------------------------------------------ the port

    def start(self, job: RunningJob, work: Work, *, time_limit_us: int | None = None) -> None:
        """Launch `job`; `time_limit_us` is ignored (the core stops overdue jobs)."""
        del time_limit_us
        if job.job_id in self._runs:
            raise JobAlreadyStarted(f"job {job.job_id} is already running here")
        who = decide(self.os_users, job.spec.user)
        if isinstance(who, Refusal):
            self._refuse(job, who)
            return
        devices = visible_devices(job, self.device_ids)
        env = self._base_environment()  # then the job's own variables over it, as bytes
        own = job_environment(job, work, devices, {})
        if who is not None:
            own.update(who.environment())
        for name, value in own.items():
            env[os.fsencode(name)] = os.fsencode(value)
        path = self.log_path(job.job_id)
        try:
            log = path.open("ab")
        except OSError as exc:
            raise ExecutorUnavailable(f"cannot open the log {path}: {exc}") from exc
        with log:
            try:
                argv = self._argv(job, work, who)
                proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=work.cwd,
                    start_new_session=True,
                    close_fds=True,
                    **_credentials(who),
                )
            except OSError as exc:
                code = _launch_failure(exc)
                detail = f"cannot start: {exc}"
                log.write(f"tally: {detail}\n".encode())
                self._reports.append(
                    JobStatus(job.job_id, RunState.FAILED, self.clock.now_us(), code, detail=detail)
                )
                return
        self._runs[job.job_id] = _Run(job.job_id, proc, self.clock.now_us(), devices)

    def stop(self, job_ids: Collection[str], reason: StopReason) -> tuple[JobStatus, ...]:
        runs = [self._runs[j] for j in dict.fromkeys(job_ids) if j in self._runs]
        signalled: set[str] = set()
        for run in runs:
            if run.proc.poll() is None:
                signal_group(run.pgid, signal.SIGTERM)
                signalled.add(run.job_id)
        self._sweep([r for r in runs if r.job_id not in signalled])
        killed: set[str] = set()
        if not wait_until(lambda: not self._alive(runs), self.grace_s):
            for run in self._alive(runs):
                signal_group(run.pgid, signal.SIGKILL)
                killed.add(run.job_id)
            if not wait_until(lambda: not self._alive(runs), self.kill_timeout_s):
                stuck = [r.job_id for r in self._alive(runs)]
                for run in runs:
                    if run.job_id not in stuck:
                        del self._runs[run.job_id]
                raise StopTimeout(
                    f"jobs {', '.join(stuck)} still have live processes "
                    f"{self.kill_timeout_s:g} s after SIGKILL",
                    stuck,
                )
        now = self.clock.now_us()
        statuses = []
        for run in runs:
            del self._runs[run.job_id]
            returncode = run.proc.wait()  # reaped already by _alive: never blocks
            if run.job_id not in signalled:  # it had ended on its own
                statuses.append(self._ended(run, returncode, now))
                continue
            _, code = exit_status(returncode)
            how = (
                f"killed with SIGKILL after {self.grace_s:g} s grace"
                if run.job_id in killed
                else f"ended after SIGTERM with exit {code}"
            )
            statuses.append(
                JobStatus(
                    job_id=run.job_id,
                    state=RunState.STOPPED,
                    time_us=now,
                    exit_code=code,
                    devices=run.devices,
                    native_id=str(run.pgid),
                    detail=f"{reason.value}: {how}",
                )
            )
        return tuple(statuses)

    def poll(self) -> tuple[JobStatus, ...]:
        out, self._reports = self._reports, []
        ended: list[_Run] = []
        for run in self._runs.values():
            if not run.reported_running:
                run.reported_running = True
                out.append(
                    JobStatus(
                        run.job_id,
                        RunState.RUNNING,
                        run.started_us,
                        devices=run.devices,
                        native_id=str(run.pgid),
                    )
                )
            returncode = run.proc.poll()
            if returncode is not None:
                ended.append(run)
                out.append(self._ended(run, returncode, self.clock.now_us()))
        for run in ended:
            del self._runs[run.job_id]
        if ended:
            self._sweep(ended)
        return tuple(out)

    def active(self) -> tuple[str, ...]:
        return tuple(self._runs)

    def _base_environment(self) -> dict[bytes, bytes]:
        """A copy of the environment jobs start from, as bytes (what `Popen` passes on): the
        given one, or this process's as it is now. The bytes of this process's are kept and
        made again only when it changed (compared with the bytes `os.environ` holds, one
        comparison in C): decoding and encoding some fifty variables per start was half of a
        start's Python."""
        if self.env is not None:
            return {os.fsencode(k): os.fsencode(v) for k, v in self.env.items()}
        held = getattr(os.environ, "_data", None)  # CPython's: the process environment as bytes
        if not isinstance(held, dict):
            return {os.fsencode(k): os.fsencode(v) for k, v in os.environ.items()}
        known = self._environ
        if known is None or known != held:
            known = self._environ = dict(held)  # never changed: each start copies it
        return dict(known)

    def log_path(self, job_id: str) -> Path:
        return log_file(self.log_dir, job_id)

    # ------------------------------------------------------------------ helpers

    def pgid(self, job_id: str) -> int | None:
        """The process group of a running job (its leader's pid)."""
        run = self._runs.get(job_id)
        return None if run is None else run.pgid

    def _argv(self, job: RunningJob, work: Work, who: RunAs | None) -> list[str]:
        if work.script is None:
            return list(work.command)
        path = self.log_dir / (log_name(job.job_id).removesuffix(".log") + ".script")
        path.write_text(work.script)
        path.chmod(0o700)
        if who is not None:  # its user runs it (the log directory must be searchable to it)
            os.chown(path, who.account.uid, who.account.gid)
        return [str(path)]

    def _refuse(self, job: RunningJob, refusal: Refusal) -> None:
        detail = f"refused to start: {refusal.reason}"
        with contextlib.suppress(OSError), self.log_path(job.job_id).open("ab") as log:
            log.write(f"tally: {detail}\n".encode())
        self._reports.append(
            JobStatus(job.job_id, RunState.FAILED, self.clock.now_us(), 126, detail=detail)
        )

    def _alive(self, runs: list[_Run]) -> list[_Run]:
        """Runs whose leader is not reaped yet or whose group still has a live process."""
        unreaped = [r for r in runs if r.proc.poll() is None]
        groups = alive_groups([r.pgid for r in runs])
        return [r for r in runs if r in unreaped or r.pgid in groups]

    def _sweep(self, ended: list[_Run]) -> None:
        """Kill what ended jobs left behind in their groups (their GPUs are being released)."""
        for pgid in alive_groups([r.pgid for r in ended]):
            signal_group(pgid, signal.SIGKILL)

    def _ended(self, run: _Run, returncode: int, now_us: int) -> JobStatus:
        state, code = exit_status(returncode)
        detail = f"killed by {_signal_name(code)}" if returncode < 0 else ""
        return JobStatus(run.job_id, state, now_us, code, (), str(run.pgid), detail)


if TYPE_CHECKING:
    _conforms: Executor = LocalExecutor(Path())
    _concurrent: StartsConcurrently = LocalExecutor(Path())
    _groups: KnowsProcessGroups = LocalExecutor(Path())
    _polls: PollsCheaply = LocalExecutor(Path())
