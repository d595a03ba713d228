"""What the scheduler keeps on disk beside the `jobs` topic, under its `work_dir`.

- `WorkStore` (`work_dir/jobs/`, files of mode 0600): each job's `Work`. Commands are not
  events (they are not the ledger's business and may carry secrets in their environment), so a
  restarted service finds them here. A job's work is kept in memory when its `JobSubmitted` is
  applied and is on disk before that event is published: the publishing round writes every
  work `put` since the last one (`detach`, off the event loop) as one batch file
  (`batch-<time>-<random>.jsonl`, one `{"job", "command", "script", "env", "cwd"}` line per
  job), written to a temporary name, fsynced, renamed, then the directory fsynced — two disk
  flushes per round however many submits it carries (one fsync per job file cost ~1.7 ms
  each on a busy disk, the end-to-end bench's limit). A submit the service crashed before
  publishing was never answered, and its job does not exist after the replay. A restarted
  service reads a job's work from the batches (indexed once, at the first job it does not
  hold) or from `<job>.json` (one file per job, what earlier versions wrote). A job whose work
  is missing fails with `executor_lost` instead of starting.
- `RunFiles` (`work_dir/runs/`): the process group of each local run, written (atomically)
  by the enactment's thread once its starts are made, all of them in one batch file
  (`write_all`: one file per enactment, not one per job), so it is on disk before the poll
  that reports the start (the enactment's own, right after: `scheduler.enactment`), and
  before the enactment ends; a batch is removed once none of its jobs runs (`forget`, carried
  out off the event loop by whoever holds the executor lock, before the enactment's stops and
  starts; a job started again is found in its newest batch). Not fsynced: the file has to
  outlive the service's process, not the machine, whose crash ends the process group too.
  After a restart, jobs the topic says are running but the executor does not know fail with
  `executor_lost` (retried per their queue), and the group such a job left behind is killed —
  only if its leader still carries the job's `TALLY_JOB_ID`; then the batches the previous
  process left are removed.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from urllib.parse import quote, unquote

import orjson

from scheduler.errors import SchedulerError
from scheduler.ports import Work


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write(item: tuple[Path, bytes]) -> None:
    """Atomically (a temporary file renamed), mode 0600: the data fsynced before the rename,
    the directory after it."""
    path, data = item
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    tmp.replace(path)
    _fsync(path.parent)


@dataclass(frozen=True, slots=True)
class Unwritten:
    """Works taken from the store to be written as one batch file and synced, by calling this
    (in a thread)."""

    dir: Path
    items: list[tuple[str, bytes]]  # (job, its JSON line)

    def __call__(self) -> None:
        if self.items:
            name = f"batch-{time.time_ns()}-{secrets.token_hex(4)}.jsonl"
            _write((self.dir / name, b"".join(line for _, line in self.items)))


class WorkStore:
    """Each job's `Work`, in batch files under `dir`, on disk before its job is published."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self._cache: dict[str, Work] = {}
        self._unsynced: list[tuple[str, bytes]] = []  # put, not yet written and synced
        self._batches: dict[str, bytes] | None = None  # job → its line, once read

    def _path(self, job_id: str) -> Path:
        return self.dir / (quote(job_id, safe="") + ".json")

    def put(self, job_id: str, work: Work) -> None:
        data = {
            "job": job_id,
            "command": list(work.command),
            "script": work.script,
            "env": [list(pair) for pair in work.env],
            "cwd": work.cwd,
        }
        self._cache[job_id] = work
        self._unsynced.append((job_id, orjson.dumps(data) + b"\n"))

    @property
    def unsynced(self) -> int:
        """Works `put` and not yet on disk."""
        return len(self._unsynced)

    def sync(self) -> None:
        """Write and fsync every work `put` since the last sync (before their jobs' events are
        published), as one batch."""
        self.detach()()

    def detach(self) -> Unwritten:
        """The works `put` since the last sync, taken now, as a call that writes and fsyncs
        them (to run off the event loop while later submits `put` more); `restore` gives them
        back if that call failed."""
        taken, self._unsynced = self._unsynced, []
        return Unwritten(self.dir, taken)

    def restore(self, detached: Unwritten) -> None:
        """Works a failed `detach` call took: written and synced with the next ones."""
        self._unsynced[:0] = detached.items

    def get(self, job_id: str) -> Work | None:
        found = self._cache.get(job_id)
        if found is not None:
            return found
        raw = self._batched().get(job_id)
        try:
            data = orjson.loads(raw if raw is not None else self._path(job_id).read_bytes())
            work = Work(
                command=tuple(data["command"]),
                script=data["script"],
                env=tuple((str(k), str(v)) for k, v in data["env"]),
                cwd=data["cwd"],
            )
        except (OSError, ValueError, KeyError, TypeError, SchedulerError):
            return None
        self._cache[job_id] = work
        return work

    def _batched(self) -> dict[str, bytes]:
        """Every job's line in the batch files on disk (read once: later works are `put`)."""
        if self._batches is None:
            self._batches = {}
            for path in sorted(self.dir.glob("batch-*.jsonl")):
                with contextlib.suppress(OSError):
                    for line in path.read_bytes().splitlines():
                        with contextlib.suppress(ValueError, TypeError, KeyError):
                            self._batches[str(orjson.loads(line)["job"])] = line
        return self._batches


class RunFiles:
    """Process groups of local runs, so a restarted service can kill what a run it lost left
    behind — only a group whose leader still carries the job's TALLY_JOB_ID.

    The groups an enactment started are one file (`write_all`: `runs/batch-<time>-<random>.pids`,
    one `<job> <group>` line each, written under a temporary name and renamed); a batch file is
    removed by the `flush` after every job in it was forgotten (or written again in a later
    batch). A group `record`ed from a status is its own file, `runs/<job>.pid` (as earlier
    versions wrote every group). A restarted service reads both (`kill_orphan`: the newest
    batch that names the job, else its own file) and removes what the previous process left
    once it has recovered (`drop_inherited`)."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self._pending: dict[str, str | None] = {}  # job → its group to record, None: forget
        self._written: dict[str, str] = {}  # job → the group on disk for it
        self._where: dict[str, str] = {}  # job → the batch file holding its group
        self._files: dict[str, tuple[str, ...]] = {}  # batch file → its jobs
        self._dirty: set[str] = set()  # batch files one of whose jobs was forgotten
        self._doomed: list[str] = []  # batch files to remove at the next flush
        self._inherited = sorted(p.name for p in self.dir.glob("batch-*.pids"))
        self._index: dict[str, str] | None = None  # job → group, from the inherited batches

    def _path(self, job_id: str) -> Path:
        return self.dir / (quote(job_id, safe="") + ".pid")

    def write(self, job_id: str, native_id: str) -> None:
        """Record the job's group now (any thread)."""
        for _, exc in self.write_all(((job_id, native_id),)):
            raise exc

    def write_all(self, groups: Iterable[tuple[str, str]]) -> list[tuple[str, OSError]]:
        """Record every (job, group) now, in one batch file (the enactment's thread, once its
        starts are made): written whole under a temporary name and renamed; if the disk refuses
        it, every job of it, with why."""
        taken = [(job, group) for job, group in groups if group.isdigit()]
        if not taken:
            return []
        name = f"batch-{time.time_ns()}-{secrets.token_hex(4)}.pids"
        path = os.path.join(self.dir, name)
        lines = "".join(f"{quote(job, safe='')} {group}\n" for job, group in taken)
        try:
            fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, lines.encode())
            finally:
                os.close(fd)
            os.replace(path + ".tmp", path)
        except OSError as exc:
            return [(job, exc) for job, _ in taken]
        self._files[name] = tuple(job for job, _ in taken)  # before any job points at it
        for job, group in taken:
            self._written[job] = group
            earlier = self._where.get(job)
            self._where[job] = name
            if earlier is not None:
                self._dirty.add(earlier)
        return []

    def record(self, job_id: str, native_id: str) -> None:
        """Record the job's group (written by the next `flush`), unless it is on disk."""
        if native_id.isdigit() and self._written.get(job_id) != native_id:
            self._pending[job_id] = native_id

    def forget(self, job_id: str) -> None:
        """Forget the job's group (its file, or its batch once no job in it runs, removed by
        the next `flush`)."""
        self._written.pop(job_id, None)
        batch = self._where.pop(job_id, None)
        if batch is not None:
            self._dirty.add(batch)
        else:
            self._pending[job_id] = None

    @property
    def pending(self) -> int:
        return len(self._pending) + len(self._dirty)

    def detach(self) -> Callable[[], None]:
        """The records and removals since the last flush, taken now (on the loop), as a call
        that carries them out (off the loop, by whoever holds the executor lock)."""
        taken, self._pending = self._pending, {}
        dirty, self._dirty = self._dirty, set()
        for name in dirty:
            jobs = self._files.get(name, ())
            if all(self._where.get(job) != name for job in jobs):
                self._files.pop(name, None)
                self._doomed.append(name)
        doomed, self._doomed = self._doomed, []
        return partial(self._carry_out, taken, doomed)

    def flush(self) -> None:
        self.detach()()

    def _carry_out(self, taken: dict[str, str | None], doomed: list[str]) -> None:
        for job_id, native_id in taken.items():
            path = self._path(job_id)
            with contextlib.suppress(OSError):
                if native_id is None:
                    path.unlink()
                else:
                    path.write_text(native_id)
        for name in doomed:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.dir, name))

    def kill_orphan(self, job_id: str) -> bool:
        """SIGKILL the group the job's last run left, if it is still that job's; True if so."""
        self.flush()
        pgid = self.recorded(job_id)
        if pgid is None:
            return False
        killed = False
        try:
            environ = Path(f"/proc/{pgid}/environ").read_bytes().split(b"\0")
            if f"TALLY_JOB_ID={job_id}".encode() in environ:
                os.killpg(pgid, signal.SIGKILL)
                killed = True
        except (OSError, ProcessLookupError):
            pass
        self.forget(job_id)
        return killed

    def recorded(self, job_id: str) -> int | None:
        """The job's group as recorded: this process's, else the newest batch the previous
        process left that names it, else the job's own file; None if none is."""
        own = self._written.get(job_id)
        if own is not None:
            return int(own)
        if self._index is None:
            self._index = {}
            for name in self._inherited:  # oldest first: a later batch wins
                with contextlib.suppress(OSError):
                    for line in (self.dir / name).read_text().splitlines():
                        job, _, number = line.rpartition(" ")
                        if number.isdigit():
                            self._index[unquote(job)] = number
        found = self._index.get(job_id)
        if found is not None:
            return int(found)
        try:
            return int(self._path(job_id).read_text())
        except (OSError, ValueError):
            return None

    def drop_inherited(self) -> None:
        """Remove the batch files the previous process left (after the recovery that read
        them: no run of it is this process's)."""
        for name in self._inherited:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.dir, name))
        self._inherited, self._index = [], None
