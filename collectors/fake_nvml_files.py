"""A fake NVML driven from a directory, for a collector in another process than the test.

This module owns `DirectoryNvml`: the in-memory `FakeNvml` (same calls, structures, errors and
quirks) whose GPUs are listed in `<dir>/gpus.json` and whose processes and XID events other
processes write as files, so `tally collect --source nvml --fake-nvml DIR` can run as a child
process and meter the **real** processes an executor started:

- `gpus.json`: `[{"uuid": "GPU-…", "name": "NVIDIA A100-SXM4-80GB", "memory_gib": 80}, …]`,
  read once (a node's GPUs do not change under a running collector);
- `procs/<device>/<pid>`: a process on a GPU, `<device>` its index or UUID (what a job finds
  in `CUDA_VISIBLE_DEVICES`), the file's text its SM utilisation in percent (rewrite it to
  change it; `0`: idle). Like the driver, only live processes are listed: a pid with no
  `/proc/<pid>` is left out (the file stays; the test owns the directory);
- `xids/<name>`: `<gpu index> <xid>`; each file is one pending XID event, taken (and deleted)
  the next time the collector waits for events.

The directory is read again at most every `refresh_s` seconds of the wall clock, at the first
NVML call after that; the fake's clock follows the wall clock then, and each listed process
gets one utilisation sample (`FakeNvml.tick`). A GPU's whole-device utilisation is the sum of
its processes' (capped at 100), its used memory theirs.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from collectors.fake_nvml import GIB, FakeGpu, FakeNvml, FakeProcess

GPUS_FILE = "gpus.json"
PROCS_DIR = "procs"
XIDS_DIR = "xids"
_PROCESS_MEMORY = 2 * GIB


def _wall_us() -> int:
    return time.time_ns() // 1_000


def _alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


class DirectoryNvml(FakeNvml):
    """`FakeNvml` whose GPUs, processes and XIDs come from files; see the module docstring."""

    def __init__(
        self,
        directory: Path,
        *,
        refresh_s: float = 0.2,
        clock: Callable[[], int] = _wall_us,
        alive: Callable[[int], bool] = _alive,
    ) -> None:
        self.directory = directory
        listed = json.loads((directory / GPUS_FILE).read_text())
        gpus = [
            FakeGpu(
                uuid=str(g["uuid"]),
                name=str(g.get("name", "NVIDIA A100-SXM4-80GB")),
                memory_total=int(g.get("memory_gib", 80)) * GIB,
                mig_capable=False,
            )
            for g in listed
        ]
        super().__init__(gpus, start_us=clock())
        self._refresh_us = int(refresh_s * 1_000_000)
        self._clock = clock
        self._alive = alive
        self._read_at: int | None = None

    def _enter(self, name: str) -> None:
        now = self._clock()
        if self._read_at is None or now - self._read_at >= self._refresh_us:
            self._read_at = now
            self._read(now)
        super()._enter(name)

    def _read(self, now_us: int) -> None:
        devices = {str(i): gpu for i, gpu in enumerate(self.gpus)}
        devices.update({gpu.uuid: gpu for gpu in self.gpus})
        for gpu in self.gpus:
            gpu.processes = []
        for entry in sorted(_listing(self.directory / PROCS_DIR)):
            on = devices.get(entry.name)
            if on is None or not entry.is_dir():
                continue
            for pid_file in sorted(_listing(entry)):
                if not pid_file.name.isdigit() or not self._alive(int(pid_file.name)):
                    continue
                sm = _percent(pid_file)
                on.processes.append(FakeProcess(int(pid_file.name), _PROCESS_MEMORY, sm))
        for gpu in self.gpus:
            gpu.util_gpu = min(100, sum(p.sm_util or 0 for p in gpu.processes))
            gpu.memory_used = sum(p.used_memory or 0 for p in gpu.processes)
        for xid_file in sorted(_listing(self.directory / XIDS_DIR)):
            try:
                index, xid = (int(part) for part in xid_file.read_text().split())
                xid_file.unlink()
            except (OSError, ValueError):
                continue  # half-written or taken already: next time
            if 0 <= index < len(self.gpus):
                self.inject_xid(index, xid)
        if now_us > self.now_us:
            self.tick((now_us - self.now_us) / 1_000_000)


def _listing(directory: Path) -> list[Path]:
    try:
        return [directory / name for name in os.listdir(directory)]
    except FileNotFoundError:
        return []


def _percent(path: Path) -> int:
    try:
        return max(0, min(100, int(path.read_text().strip() or "0")))
    except (OSError, ValueError):
        return 0
