"""Process groups on Linux: which are still alive, signalling them, waiting them out.

A group is alive while any process in it is not a zombie: a zombie holds no GPU memory and is
reaped by its parent (or by init once orphaned), so it does not keep a job's GPUs busy. Where
/proc is missing (not Linux), `kill(-pgid, 0)` answers instead, which counts zombies as alive.
A process that leaves its group (setsid, setpgid) is not tracked: containing those needs
cgroups, which Slurm has and the local executor does not.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Collection
from pathlib import Path

PROC = Path("/proc")


def _state_and_group(pid_dir: Path) -> tuple[str, int] | None:
    """(state, pgrp) from /proc/<pid>/stat; None once the process is gone."""
    try:
        raw = (pid_dir / "stat").read_text()
    except OSError:
        return None
    # the command name, in parentheses, may hold spaces and parentheses: split after the last ')'
    rest = raw[raw.rfind(")") + 2 :].split()
    if len(rest) < 3:
        return None
    return rest[0], int(rest[2])


def alive_groups(pgids: Collection[int]) -> frozenset[int]:
    """Those of `pgids` that still have a process that is not a zombie: a group `kill(-pgid,
    0)` finds no process in is not (the usual case once a job's leader is reaped: no /proc
    scan); the others by one /proc scan."""
    wanted = frozenset(p for p in pgids if _killpg_alive(p))
    if not wanted:
        return frozenset()
    if not PROC.is_dir():
        return wanted
    alive: set[int] = set()
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        fields = _state_and_group(entry)
        if fields is not None and fields[1] in wanted and fields[0] not in ("Z", "X"):
            alive.add(fields[1])
    return frozenset(alive)


def group_members(pgid: int) -> tuple[int, ...]:
    """The live (not zombie) processes of group `pgid`, by pid."""
    if not PROC.is_dir():
        return (pgid,) if _killpg_alive(pgid) else ()
    members = []
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            fields = _state_and_group(entry)
            if fields is not None and fields[1] == pgid and fields[0] not in ("Z", "X"):
                members.append(int(entry.name))
    return tuple(sorted(members))


def _killpg_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def signal_group(pgid: int, sig: signal.Signals) -> bool:
    """Send `sig` to every process of the group; False when the group is already gone."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


def wait_until(done: Callable[[], bool], timeout_s: float, interval_s: float = 0.02) -> bool:
    """Call `done` until it is true or `timeout_s` has passed; its last answer."""
    deadline = time.monotonic() + timeout_s
    while True:
        if done():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)
