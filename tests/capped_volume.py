"""A volume that really fills up, for disk-full tests without root: a tmpfs of a fixed size,
mounted in a user and mount namespace of its own (`unshare --user --map-root-user --mount`)
that a small holder process keeps alive. This process, and any child it starts, reach the tmpfs
through the holder's root, `/proc/<holder pid>/root/<mount point>`; a data directory's
`segments/` or `archive/` is made a symbolic link to a folder on it. Writes past its size fail
in the kernel with ENOSPC, exactly as on a full disk; deleting the ballast gives the space back.

The mount is private to the holder's namespace (nothing is mounted on the host) and goes away
with the holder, which exits when its standard input closes: when the test ends, or when the
test process dies.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

_HOLDER = 'mount -t tmpfs -o "size=$2" tmpfs "$1" && echo mounted && read _'
_CHUNKS = (1 << 20, 1 << 16, 1 << 12)


class VolumeUnavailable(RuntimeError):
    """This machine cannot mount a tmpfs in a user namespace (no `unshare`, or user namespaces
    are disabled)."""


class CappedVolume:
    """A tmpfs of `size_bytes` at `mount_point` (an empty, absolute directory), seen here at
    `path`."""

    def __init__(self, mount_point: Path, size_bytes: int) -> None:
        self.mount_point = mount_point.resolve()
        self.size_bytes = size_bytes
        self._holder: subprocess.Popen[bytes] | None = None
        self._ballast: Path | None = None

    @property
    def path(self) -> Path:
        assert self._holder is not None, "the volume is not mounted"
        return Path(f"/proc/{self._holder.pid}/root") / self.mount_point.relative_to("/")

    def start(self) -> CappedVolume:
        unshare = shutil.which("unshare")
        if unshare is None:
            raise VolumeUnavailable("no unshare(1) on this machine")
        self.mount_point.mkdir(parents=True, exist_ok=True)
        holder = subprocess.Popen(
            [unshare, "--user", "--map-root-user", "--mount", "sh", "-c", _HOLDER, "holder"]
            + [str(self.mount_point), str(self.size_bytes)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert holder.stdout is not None and holder.stderr is not None
        if holder.stdout.readline().strip() != b"mounted":
            _, err = holder.communicate(timeout=10)
            why = err.decode(errors="replace").strip()
            raise VolumeUnavailable(f"cannot mount a tmpfs in a user namespace: {why}")
        self._holder = holder
        return self

    def folder(self, name: str) -> Path:
        """A folder on the volume."""
        found = self.path / name
        found.mkdir(exist_ok=True)
        return found

    def fill(self, leave_bytes: int = 0) -> int:
        """Write a ballast file until the volume is full (or only about `leave_bytes` are
        left); the bytes written."""
        self._ballast = self.path / "ballast"
        written = 0
        free = self.free_bytes()
        fd = os.open(self._ballast, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            for chunk in _CHUNKS:
                block = b"\0" * chunk
                while free - chunk >= leave_bytes:
                    try:
                        written += os.write(fd, block)
                    except OSError as exc:
                        if exc.errno != errno.ENOSPC:
                            raise
                        break
                    free -= chunk
        finally:
            os.close(fd)
        return written

    def free_bytes(self) -> int:
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    def release(self) -> None:
        """Delete the ballast: the space returns."""
        if self._ballast is not None:
            self._ballast.unlink(missing_ok=True)
            self._ballast = None

    def stop(self) -> None:
        if self._holder is None:
            return
        holder, self._holder = self._holder, None
        try:
            holder.communicate(timeout=10)  # closes its stdin: `read` returns, the tmpfs goes
        except subprocess.TimeoutExpired:
            holder.kill()
            holder.communicate()


@contextmanager
def capped_volume(mount_point: Path, size_bytes: int) -> Iterator[CappedVolume]:
    """A mounted `CappedVolume`; the test is skipped, saying why, where none can be mounted."""
    volume = CappedVolume(mount_point, size_bytes)
    try:
        volume.start()
    except VolumeUnavailable as exc:
        pytest.skip(str(exc))
    try:
        yield volume
    finally:
        volume.stop()


def put_on(volume: CappedVolume, data_dir: Path, *folders: str) -> None:
    """Make each of `folders` of `data_dir` (`segments`, `archive`) a link to a folder of the
    same name on `volume`."""
    data_dir.mkdir(parents=True, exist_ok=True)
    for name in folders:
        (data_dir / name).symlink_to(volume.folder(name), target_is_directory=True)
