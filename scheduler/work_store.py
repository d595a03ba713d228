"""What the scheduler keeps on disk beside the `jobs` topic, under its `work_dir`.

- `WorkStore` (`work_dir/jobs/<job>.json`, mode 0600): each job's `Work`. Commands are not
  events (they are not the ledger's business and may carry secrets in their environment), so a
  restarted service finds them here. A job's work is written, atomically, before its
  `JobSubmitted` is applied, and is on disk (fsync) before that event is published: the
  dispatcher syncs the store whenever its outbox is taken for publishing, every file written
  since the last sync at once (concurrent fsyncs share the file system's journal commits, so
  submits published together cost about one disk flush, not one each). A job whose work is
  missing fails with `executor_lost` instead of starting.
- `RunFiles` (`work_dir/runs/<job>.pid`): the process group of each local run, recorded while it
  runs and forgotten when its job stops running. After a restart, jobs the topic says are
  running but the executor does not know fail with `executor_lost` (retried per their queue),
  and the group such a job left behind is killed — only if its leader still carries the job's
  `TALLY_JOB_ID`.
"""

from __future__ import annotations

import contextlib
import os
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import quote

import orjson

from scheduler.errors import SchedulerError
from scheduler.ports import Work

SYNC_THREADS = 16


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class WorkStore:
    """Each job's `Work`, one JSON file per job under `dir`, written before it is submitted."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self._cache: dict[str, Work] = {}
        self._unsynced: list[Path] = []

    def _path(self, job_id: str) -> Path:
        return self.dir / (quote(job_id, safe="") + ".json")

    def put(self, job_id: str, work: Work) -> None:
        data = {
            "command": list(work.command),
            "script": work.script,
            "env": [list(pair) for pair in work.env],
            "cwd": work.cwd,
        }
        path = self._path(job_id)
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(orjson.dumps(data))
        tmp.replace(path)
        self._cache[job_id] = work
        self._unsynced.append(path)

    @property
    def unsynced(self) -> int:
        """Files `put` and not yet synced."""
        return len(self._unsynced)

    def sync(self) -> None:
        """fsync every file `put` since the last sync (before their jobs' events are
        published), concurrently."""
        paths, self._unsynced = self._unsynced, []
        if len(paths) == 1:
            _fsync(paths[0])
        elif paths:
            with ThreadPoolExecutor(min(SYNC_THREADS, len(paths))) as pool:
                list(pool.map(_fsync, paths))

    def get(self, job_id: str) -> Work | None:
        found = self._cache.get(job_id)
        if found is not None:
            return found
        try:
            data = orjson.loads(self._path(job_id).read_bytes())
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


class RunFiles:
    """Process groups of local runs (`runs/<job>.pid`), so a restarted service can kill what a
    run it lost left behind — only a group whose leader still carries the job's TALLY_JOB_ID."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)

    def _path(self, job_id: str) -> Path:
        return self.dir / (quote(job_id, safe="") + ".pid")

    def record(self, job_id: str, native_id: str) -> None:
        if native_id.isdigit():
            self._path(job_id).write_text(native_id)

    def forget(self, job_id: str) -> None:
        with contextlib.suppress(OSError):
            self._path(job_id).unlink()

    def kill_orphan(self, job_id: str) -> bool:
        """SIGKILL the group the job's last run left, if it is still that job's; True if so."""
        path = self._path(job_id)
        try:
            pgid = int(path.read_text())
        except (OSError, ValueError):
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
