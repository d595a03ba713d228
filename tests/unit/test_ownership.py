"""Process → owner mapping: cgroup and environ parsing on real path formats, /proc resolution."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from collectors.ownership import (
    CgroupKind,
    CgroupOwner,
    EnvOwner,
    OwnerResolver,
    merge_owner,
    parse_cgroup,
    parse_environ,
    parse_status_uid,
    user_name_from_passwd,
)
from ledger.events import Owner

POD = "1234abcd-5678-4def-9abc-0123456789ab"
POD_SYSTEMD = POD.replace("-", "_")
CTR = "c0ffee00" * 8  # a 64-hex container id
DOCKER = "deadbeef" * 8


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # Slurm, cgroup v1 (one line per controller; the first that names a job decides)
        (
            "12:pids:/\n11:memory:/slurm/uid_1000/job_123/step_0/task_0\n",
            CgroupOwner(CgroupKind.SLURM, "123", step="0"),
        ),
        (
            "5:cpuset:/slurm/uid_1000/job_4242/step_batch/task_0",
            CgroupOwner(CgroupKind.SLURM, "4242", step="batch"),
        ),
        # Slurm, cgroup v2 (slurmstepd scope), also with a multiple-slurmd node prefix
        (
            "0::/system.slice/slurmstepd.scope/job_987/step_0/user/task_0",
            CgroupOwner(CgroupKind.SLURM, "987", step="0"),
        ),
        (
            "0::/system.slice/node01_slurmstepd.scope/job_55/step_extern/user/task_0",
            CgroupOwner(CgroupKind.SLURM, "55", step="extern"),
        ),
        ("0::/system.slice/slurmstepd.scope/job_77", CgroupOwner(CgroupKind.SLURM, "77")),
        # Kubernetes, systemd driver (cgroup v2): underscores in the pod UID become dashes
        (
            f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD_SYSTEMD}"
            f".slice/cri-containerd-{CTR}.scope",
            CgroupOwner(CgroupKind.K8S_POD, POD, CTR, "burstable"),
        ),
        (
            f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{POD_SYSTEMD}"
            f".slice/cri-containerd-{CTR}.scope",
            CgroupOwner(CgroupKind.K8S_POD, POD, CTR, "besteffort"),
        ),
        (
            f"0::/kubepods.slice/kubepods-pod{POD_SYSTEMD}.slice/cri-containerd-{CTR}.scope",
            CgroupOwner(CgroupKind.K8S_POD, POD, CTR, "guaranteed"),
        ),
        (
            f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD_SYSTEMD}"
            f".slice/crio-{CTR}.scope",
            CgroupOwner(CgroupKind.K8S_POD, POD, CTR, "burstable"),
        ),
        # Kubernetes, systemd driver, cgroup v1 (same path under each controller)
        (
            f"10:memory:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
            f"{POD_SYSTEMD}.slice/docker-{CTR}.scope",
            CgroupOwner(CgroupKind.K8S_POD, POD, CTR, "burstable"),
        ),
        # Kubernetes, cgroupfs driver (v1 and v2), every QoS class
        (
            f"11:memory:/kubepods/burstable/pod{POD}/{CTR}",
            CgroupOwner(CgroupKind.K8S_POD, POD, CTR, "burstable"),
        ),
        (
            f"0::/kubepods/besteffort/pod{POD}/{CTR}",
            CgroupOwner(CgroupKind.K8S_POD, POD, CTR, "besteffort"),
        ),
        (
            f"4:cpu,cpuacct:/kubepods/pod{POD}/{CTR}",
            CgroupOwner(CgroupKind.K8S_POD, POD, CTR, "guaranteed"),
        ),
        (f"0::/kubepods/pod{POD}", CgroupOwner(CgroupKind.K8S_POD, POD, None, "guaranteed")),
        # Docker, cgroupfs and systemd drivers
        (f"4:memory:/docker/{DOCKER}", CgroupOwner(CgroupKind.DOCKER, DOCKER, DOCKER)),
        (f"0::/system.slice/docker-{DOCKER}.scope", CgroupOwner(CgroupKind.DOCKER, DOCKER, DOCKER)),
        # Nobody in particular
        ("0::/", None),
        ("0::/user.slice/user-1000.slice/session-3.scope", None),
        ("0::/init.scope", None),
        ("0::/system.slice/docker-abc.scope", None),  # not a 64-hex id
        ("", None),
        ("not a cgroup line", None),
    ],
)
def test_parse_cgroup(text: str, expected: CgroupOwner | None) -> None:
    assert parse_cgroup(text) == expected


@pytest.mark.parametrize(
    ("owner", "job_id"),
    [
        (CgroupOwner(CgroupKind.SLURM, "123"), "slurm:123"),
        (CgroupOwner(CgroupKind.K8S_POD, POD, CTR), f"k8s-pod:{POD}"),
        (CgroupOwner(CgroupKind.DOCKER, DOCKER, DOCKER), "docker:deadbeefdead"),
    ],
)
def test_cgroup_job_ids(owner: CgroupOwner, job_id: str) -> None:
    assert owner.job_id == job_id


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (
            b"PATH=/usr/bin\0TALLY_JOB_ID=j-42\0TALLY_TEAM=vision\0TALLY_PROJECT=detection\0",
            EnvOwner(tally_job_id="j-42", team="vision", project="detection"),
        ),
        (
            b"SLURM_JOB_ID=123\0SLURM_JOB_USER=ada\0USER=root\0",
            EnvOwner(slurm_job_id="123", user="ada"),
        ),
        (b"SLURM_JOBID=9\0", EnvOwner(slurm_job_id="9")),
        (b"TALLY_USER=grace\0USER=root\0", EnvOwner(user="grace")),
        (b"USER=alan\0HOME=/home/alan\0", EnvOwner(user="alan")),
        (b"TALLY_TEAM=first\0TALLY_TEAM=second\0", EnvOwner(team="first")),  # like getenv
        (b"TALLY_TEAM=\0TALLY_PROJECT=  \0", None),  # empty values say nothing
        (b"garbage-without-equals\0TALLY_JOB_ID=j-1", EnvOwner(tally_job_id="j-1")),
        (b"TALLY_TEAM=caf\xe9\0", EnvOwner(team="caf\ufffd")),  # undecodable bytes replaced
        (b"PATH=/bin\0HOME=/root\0", None),
        (b"", None),
    ],
)
def test_parse_environ(data: bytes, expected: EnvOwner | None) -> None:
    assert parse_environ(data) == expected


def test_environ_job_id_prefers_tally_over_slurm() -> None:
    assert EnvOwner(tally_job_id="j-7", slurm_job_id="123").job_id == "j-7"
    assert EnvOwner(slurm_job_id="123").job_id == "slurm:123"
    assert EnvOwner(team="x").job_id is None


@pytest.mark.parametrize(
    ("text", "uid"),
    [
        ("Name:\tpython\nUid:\t1000\t1000\t1000\t1000\nGid:\t100\n", 1000),
        ("Uid:\t0\t0\t0\t0\n", 0),
        ("Name:\tkthreadd\n", None),
    ],
)
def test_parse_status_uid(text: str, uid: int | None) -> None:
    assert parse_status_uid(text) == uid


def test_merge_prefers_registry_then_environment_then_uid() -> None:
    registry = Owner(team="vision", project=None, user=None, job_id=None)
    env = EnvOwner(tally_job_id="j-1", team="spoofed", project="detection", user="ada")
    assert merge_owner("j-1", registry, env, "uid-user") == Owner(
        team="vision", project="detection", user="ada", job_id="j-1"
    )
    assert merge_owner("slurm:1", None, None, "bob") == Owner(user="bob", job_id="slurm:1")
    assert merge_owner(None, None, None, None) is None


def test_user_name_from_passwd() -> None:
    assert user_name_from_passwd(0) == "root"
    assert user_name_from_passwd(2_000_000_123) == "uid:2000000123"


# ---------------------------------------------------------------------------- /proc resolution


def _proc(
    root: Path,
    pid: int,
    environ: bytes | None = None,
    cgroup: str | None = None,
    uid: int | None = 1000,
) -> None:
    base = root / str(pid)
    base.mkdir(parents=True)
    if environ is not None:
        (base / "environ").write_bytes(environ)
    if cgroup is not None:
        (base / "cgroup").write_text(cgroup)
    if uid is not None:
        (base / "status").write_text(f"Name:\tpython\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")


def _names(uid: int) -> str | None:
    return {1000: "ada", 1001: "grace"}.get(uid)


GPU = "GPU-00000000-0000-4000-8000-000000000000"


def test_environment_job_with_registry_lookup(tmp_path: Path) -> None:
    _proc(tmp_path, 10, environ=b"TALLY_JOB_ID=j-42\0TALLY_TEAM=spoofed\0TALLY_PROJECT=det\0")
    registry = {"j-42": Owner(team="vision")}
    resolver = OwnerResolver(tmp_path, lookup=registry.get, user_name=_names)
    assert resolver(10, GPU) == Owner(team="vision", project="det", user="ada", job_id="j-42")


def test_slurm_environment_beats_cgroup(tmp_path: Path) -> None:
    _proc(
        tmp_path,
        11,
        environ=b"SLURM_JOB_ID=500\0SLURM_JOB_USER=grace\0",
        cgroup="0::/system.slice/slurmstepd.scope/job_999/step_0/user/task_0",
    )
    resolver = OwnerResolver(tmp_path, user_name=_names)
    assert resolver(11, GPU) == Owner(user="grace", job_id="slurm:500")


@pytest.mark.parametrize(
    ("cgroup", "job_id"),
    [
        ("11:memory:/slurm/uid_1000/job_123/step_0/task_0", "slurm:123"),
        (
            f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD_SYSTEMD}"
            f".slice/cri-containerd-{CTR}.scope",
            f"k8s-pod:{POD}",
        ),
        (f"0::/system.slice/docker-{DOCKER}.scope", "docker:deadbeefdead"),
    ],
)
def test_cgroup_job_when_environment_is_silent(tmp_path: Path, cgroup: str, job_id: str) -> None:
    _proc(tmp_path, 12, environ=b"PATH=/bin\0", cgroup=cgroup, uid=1001)
    assert OwnerResolver(tmp_path, user_name=_names)(12, GPU) == Owner(user="grace", job_id=job_id)


def test_unreadable_environ_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _proc(tmp_path, 13, environ=b"TALLY_JOB_ID=hidden\0", cgroup="0::/slurm/job_8/step_0")
    real_open = Path.open

    def guarded(self: Path, *args: Any, **kwargs: Any) -> Any:
        if self.name == "environ":
            raise PermissionError(13, "Permission denied", str(self))
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", guarded)
    assert OwnerResolver(tmp_path, user_name=_names)(13, GPU) == Owner(user="ada", job_id="slurm:8")


def test_exited_process_falls_back_to_the_gpu_assignment(tmp_path: Path) -> None:
    assigned = Owner(team="nlp", project="llm", user=None, job_id="j-9")
    resolver = OwnerResolver(tmp_path, assignment={GPU: assigned}.get, user_name=_names)
    assert resolver(99, GPU) == assigned  # no /proc/99 at all
    assert resolver(99, "GPU-other") is None


def test_assignment_only_when_the_process_names_no_job(tmp_path: Path) -> None:
    _proc(tmp_path, 14, cgroup="0::/user.slice/user-1000.slice/session-3.scope")
    _proc(tmp_path, 15, cgroup="0::/slurm/uid_1000/job_5/step_0")
    assigned = Owner(team="nlp", job_id="j-9")
    resolver = OwnerResolver(tmp_path, assignment=lambda _uuid: assigned, user_name=_names)
    assert resolver(14, GPU) == assigned
    assert resolver(15, GPU) == Owner(user="ada", job_id="slurm:5")


def test_only_the_user_is_known(tmp_path: Path) -> None:
    _proc(tmp_path, 16, cgroup="0::/init.scope", uid=1001)
    _proc(tmp_path, 17, uid=None)
    resolver = OwnerResolver(tmp_path, user_name=_names)
    assert resolver(16, GPU) == Owner(user="grace")
    assert resolver(17, GPU) is None
