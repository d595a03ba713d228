"""Process → owner mapping: who a GPU process belongs to.

This module owns the rules that turn a host PID (as NVML reports it) into a `ledger.events.Owner`.
Parsing is pure (`parse_environ`, `parse_cgroup`); `/proc` is read only by `OwnerResolver`, under a
root that tests point at a fake tree.

Precedence of the job identity (first that is known wins):
1. `TALLY_JOB_ID` in the process environment (set by Tally's own executors), then `SLURM_JOB_ID`
   there (as `slurm:<id>`);
2. the process's cgroup: a Slurm job (`slurm:<id>`), a Kubernetes pod (`k8s-pod:<uid>`), a docker
   container (`docker:<first 12 hex>`);
3. the GPU's current assignment from the scheduler (`assignment(gpu_uuid)`), taken as a whole.

A Kubernetes pod is resolved through `pods(uid)` (the kubelet, `collectors.kubelet`) to its
canonical job id `k8s:<namespace>/<name>` and the team and project of its namespace and labels
(`collectors.k8s_identity`); a pod the kubelet does not know stays `k8s-pod:<uid>`.

Team, project and user: the registry `lookup(job_id)` wins field by field (the environment is
under the user's control, the registry is not); then the workload manager's word: the pod's
owner, or for a Slurm job without `TALLY_JOB_ID` (one Tally did not submit) its account
(`SLURM_JOB_ACCOUNT` in the environment, else `slurm_account(job id)`, i.e. scontrol) mapped
through `accounts` (an unknown account is the team `unmapped:<account>`,
`collectors.slurm_account`); missing fields then come from `TALLY_TEAM`, `TALLY_PROJECT`,
`TALLY_USER` (or `SLURM_JOB_USER`, `USER`) in the environment; a still-missing user comes from
the `Uid:` line of `/proc/<pid>/status` through `pwd`.

Unreadable `/proc` files (another user's process, a process that just exited) are skipped, never
raised. PIDs are host PIDs: the collector must run in the host PID namespace.
"""

from __future__ import annotations

import pwd
import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from collectors.slurm_account import AccountOwners, account_owner
from ledger.events import Owner

OwnerLookup = Callable[[str], Owner | None]
PodOwnerLookup = Callable[[str], Owner | None]  # pod uid → owner with `k8s:<ns>/<name>`
SlurmAccountLookup = Callable[[str], str | None]  # Slurm job id → account
Assignment = Callable[[str], Owner | None]
UserName = Callable[[int], str | None]

_POD_PREFIX = "k8s-pod:"
_SLURM_PREFIX = "slurm:"
_MAX_PROC_READ = 1 << 20  # environ is bounded by ARG_MAX; never read more than 1 MiB


class CgroupKind(StrEnum):
    """Which workload manager a cgroup path belongs to."""

    SLURM = "slurm"
    K8S_POD = "k8s-pod"
    DOCKER = "docker"


@dataclass(frozen=True, slots=True)
class CgroupOwner:
    """What a cgroup path says about a process: the job, pod or container it runs in."""

    kind: CgroupKind
    id: str
    container_id: str | None = None
    qos: str | None = None
    step: str | None = None

    @property
    def job_id(self) -> str:
        """The canonical job id: `slurm:123`, `k8s-pod:<uid>`, `docker:<12 hex>`."""
        if self.kind is CgroupKind.DOCKER:
            return f"docker:{self.id[:12]}"
        return f"{self.kind.value}:{self.id}"


@dataclass(frozen=True, slots=True)
class EnvOwner:
    """The ownership facts found in a process environment."""

    tally_job_id: str | None = None
    slurm_job_id: str | None = None
    team: str | None = None
    project: str | None = None
    user: str | None = None
    slurm_account: str | None = None

    @property
    def job_id(self) -> str | None:
        if self.tally_job_id:
            return self.tally_job_id
        if self.slurm_job_id:
            return f"slurm:{self.slurm_job_id}"
        return None


# ---------------------------------------------------------------------------- pure parsing

_ENV_KEYS = {
    b"TALLY_JOB_ID": "tally_job_id",
    b"SLURM_JOB_ID": "slurm_job_id",
    b"SLURM_JOBID": "slurm_job_id",
    b"TALLY_TEAM": "team",
    b"TALLY_PROJECT": "project",
    b"TALLY_USER": "user",
    b"SLURM_JOB_ACCOUNT": "slurm_account",
}
_USER_FALLBACK_KEYS = (b"SLURM_JOB_USER", b"USER")
_MAX_VALUE = 256


def _env_value(raw: bytes) -> str | None:
    text = raw.decode("utf-8", "replace").strip()
    if not text or len(text) > _MAX_VALUE:
        return None
    return text


def parse_environ(data: bytes) -> EnvOwner | None:
    """Ownership facts from the NUL-separated contents of `/proc/<pid>/environ`.

    Returns None when the environment names no job, team, project or user.
    """
    found: dict[str, str] = {}
    fallback_user: dict[bytes, str] = {}
    for entry in data.split(b"\0"):
        key, sep, value = entry.partition(b"=")
        if not sep:
            continue
        field = _ENV_KEYS.get(key)
        parsed = _env_value(value)
        if parsed is None:
            continue
        if field is not None:
            found.setdefault(field, parsed)  # the first definition wins, like getenv
        elif key in _USER_FALLBACK_KEYS:
            fallback_user.setdefault(key, parsed)
    if "user" not in found:
        for key in _USER_FALLBACK_KEYS:
            if key in fallback_user:
                found["user"] = fallback_user[key]
                break
    if not found:
        return None
    return EnvOwner(**found)


_HEX64 = r"[0-9a-f]{64}"
_SLURM_JOB = re.compile(r"(?:^|/)job_(\d+)(?:/|$)")
_SLURM_STEP = re.compile(r"/step_([A-Za-z0-9_]+)(?:/|$)")
_K8S_SYSTEMD = re.compile(
    r"kubepods(?:-(besteffort|burstable))?-pod([0-9a-f]{8}_[0-9a-f]{4}_[0-9a-f]{4}_[0-9a-f]{4}_"
    r"[0-9a-f]{12})\.slice"
)
_K8S_CGROUPFS = re.compile(
    r"/kubepods(?:/(besteffort|burstable))?/pod([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-"
    r"[0-9a-f]{12})(?:/|$)"
)
_SCOPE_CONTAINER = re.compile(rf"(?:cri-containerd|crio|docker|containerd)-({_HEX64})\.scope")
_PLAIN_CONTAINER = re.compile(rf"/({_HEX64})(?:/|$)")
_DOCKER_CGROUPFS = re.compile(rf"/docker/({_HEX64})(?:/|$)")
_DOCKER_SYSTEMD = re.compile(rf"/docker-({_HEX64})\.scope")


def _container_id(path: str) -> str | None:
    match = _SCOPE_CONTAINER.search(path) or _PLAIN_CONTAINER.search(path)
    return match.group(1) if match else None


def parse_cgroup_path(path: str) -> CgroupOwner | None:
    """What one cgroup path (the part after `hierarchy:controllers:`) says, or None."""
    if "kubepods" in path:
        systemd = _K8S_SYSTEMD.search(path)
        if systemd is not None:
            qos = systemd.group(1) or "guaranteed"
            uid = systemd.group(2).replace("_", "-")
            return CgroupOwner(CgroupKind.K8S_POD, uid, _container_id(path), qos)
        cgroupfs = _K8S_CGROUPFS.search(path)
        if cgroupfs is not None:
            qos = cgroupfs.group(1) or "guaranteed"
            return CgroupOwner(CgroupKind.K8S_POD, cgroupfs.group(2), _container_id(path), qos)
    if "slurm" in path or "job_" in path:
        job = _SLURM_JOB.search(path)
        if job is not None:
            step = _SLURM_STEP.search(path)
            return CgroupOwner(CgroupKind.SLURM, job.group(1), step=step.group(1) if step else None)
    docker = _DOCKER_CGROUPFS.search(path) or _DOCKER_SYSTEMD.search(path)
    if docker is not None:
        return CgroupOwner(CgroupKind.DOCKER, docker.group(1), docker.group(1))
    return None


def parse_cgroup(text: str) -> CgroupOwner | None:
    """The owner named by the contents of `/proc/<pid>/cgroup` (cgroup v1 or v2), or None.

    Lines are `hierarchy-id:controllers:path`; the first line whose path names a Slurm job, a
    Kubernetes pod or a docker container decides.
    """
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        owner = parse_cgroup_path(parts[2].strip())
        if owner is not None:
            return owner
    return None


_UID_LINE = re.compile(r"^Uid:\s+(\d+)", re.MULTILINE)


def parse_status_uid(text: str) -> int | None:
    """The real uid from the contents of `/proc/<pid>/status`, or None."""
    match = _UID_LINE.search(text)
    return int(match.group(1)) if match else None


def merge_owner(
    job_id: str | None,
    registry: Owner | None,
    env: EnvOwner | None,
    user: str | None,
    workload: Owner | None = None,
) -> Owner | None:
    """Combine the sources field by field: registry, then the workload manager (pod, Slurm
    account), then environment, then the uid's name."""
    reg = registry or Owner()
    work = workload or Owner()
    owner = Owner(
        team=reg.team or work.team or (env.team if env else None),
        project=reg.project or work.project or (env.project if env else None),
        user=reg.user or (env.user if env else None) or user,
        job_id=reg.job_id or job_id,
    )
    return None if owner == Owner() else owner


# ---------------------------------------------------------------------------- /proc reading


def user_name_from_passwd(uid: int) -> str | None:
    """The login name of `uid`, or `uid:<n>` when the passwd database does not know it."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid:{uid}"


def _read(path: Path) -> bytes | None:
    try:
        with path.open("rb") as handle:
            return handle.read(_MAX_PROC_READ)
    except OSError:  # PermissionError, FileNotFoundError, ProcessLookupError (exited), …
        return None


class OwnerResolver:
    """Resolve a GPU process to its owner from `/proc`, a registry and the scheduler.

    Call it as `resolver(pid, gpu_uuid)`. `lookup(job_id)` is the registry of jobs and pods
    (default: none, so owners carry the job id only); `assignment(gpu_uuid)` is the scheduler's
    current owner of the GPU, used only when the process itself names no job. `pods(uid)`
    resolves a pod uid (default: none, pods stay `k8s-pod:<uid>`); `slurm_account(job id)`
    asks Slurm for a job's account when the environment does not name it, and `accounts` maps
    accounts to (team, project).
    """

    __slots__ = ("_accounts", "_assignment", "_lookup", "_pods", "_root", "_slurm", "_user_name")

    def __init__(
        self,
        proc_root: str | Path = "/proc",
        lookup: OwnerLookup | None = None,
        assignment: Assignment | None = None,
        user_name: UserName = user_name_from_passwd,
        *,
        pods: PodOwnerLookup | None = None,
        slurm_account: SlurmAccountLookup | None = None,
        accounts: AccountOwners | None = None,
    ) -> None:
        self._root = Path(proc_root)
        self._lookup = lookup
        self._assignment = assignment
        self._user_name = user_name
        self._pods = pods
        self._slurm = slurm_account
        self._accounts: AccountOwners = accounts or {}

    def __call__(self, pid: int, gpu_uuid: str) -> Owner | None:
        base = self._root / str(pid)
        environ = _read(base / "environ")
        env = parse_environ(environ) if environ is not None else None
        job_id = env.job_id if env is not None else None
        if job_id is None:
            cgroup = _read(base / "cgroup")
            parsed = parse_cgroup(cgroup.decode("utf-8", "replace")) if cgroup else None
            job_id = parsed.job_id if parsed is not None else None
        if job_id is None and self._assignment is not None:
            assigned = self._assignment(gpu_uuid)
            if assigned is not None:
                return assigned
        workload = None
        if job_id is not None and job_id.startswith(_POD_PREFIX) and self._pods is not None:
            workload = self._pods(job_id.removeprefix(_POD_PREFIX))
            job_id = workload.job_id if workload is not None and workload.job_id else job_id
        registry = self._lookup(job_id) if job_id is not None and self._lookup else None
        if workload is None and (registry is None or registry.team is None):
            workload = self._slurm_owner(job_id, env)
        user = None
        if (registry is None or registry.user is None) and (env is None or env.user is None):
            user = self._uid_user(base)
        return merge_owner(job_id, registry, env, user, workload)

    def _slurm_owner(self, job_id: str | None, env: EnvOwner | None) -> Owner | None:
        """Team and project of a Slurm job Tally did not submit, from its account."""
        if job_id is None or not job_id.startswith(_SLURM_PREFIX):
            return None
        if env is not None and env.tally_job_id:
            return None  # Tally's own job: the ledger knows its team
        account = env.slurm_account if env is not None else None
        if account is None and self._slurm is not None:
            account = self._slurm(job_id.removeprefix(_SLURM_PREFIX))
        if account is None:
            return None
        team, project = account_owner(account, self._accounts)
        return Owner(team=team, project=project)

    def _uid_user(self, base: Path) -> str | None:
        status = _read(base / "status")
        if status is None:
            return None
        uid = parse_status_uid(status.decode("utf-8", "replace"))
        return self._user_name(uid) if uid is not None else None
