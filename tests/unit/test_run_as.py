"""Jobs run as their submitter (`identity.os_users`): the pure decision as a table, its
configuration, and the local executor on real processes — as root it drops a job to `nobody`
(the child's real uid and gid read from /proc), and it refuses, without running anything, a
job it may not run as its submitter (unmapped; and, in a child that became `nobody` first, a
job of another OS user); the Slurm executor's `--account`, `--uid`/`--gid` and refusal on the
scripted Slurm runner."""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from scheduler.executors.fake import ManualClock
from scheduler.executors.local import LocalExecutor
from scheduler.executors.run_as import (
    OsAccount,
    OsUsers,
    Refusal,
    RunAs,
    account_of,
    run_as,
)
from scheduler.executors.slurm import SlurmExecutor
from scheduler.model import Flavor, GpuRef, RunningJob
from scheduler.ports import JobStatus, MemoryPublisher, RunState, StopReason, Work
from scheduler.records import SubmitRequest
from scheduler.service import SchedulerService
from tally.config import ConfigError, parse_config
from tally.identity_config import IdentityConfig, slurm_account_of_team
from tally.scheduling import build_dispatcher
from tests.scheduler_builders import a_spec
from tests.slurm.test_slurm_executor import ScriptedRunner, ok
from tests.unit.test_scheduler_service_support import SECOND_US, T0_US, config_data

ROOT = OsAccount("root", 0, 0, "/root", (0,))
ALICE = OsAccount("alice", 1001, 1001, "/home/alice", (1001, 27))
BOB = OsAccount("bsmith", 1002, 100, "/home/bsmith", (100,))
ACCOUNTS = {a.name: a for a in (ROOT, ALICE, BOB)}
MAPPED = OsUsers({"alice": "alice", "bob": "bsmith", "admin": "root", "ghost": "nosuch"})


@dataclass(frozen=True, slots=True)
class Case:
    current_uid: int
    os_users: OsUsers
    tally_user: str
    expected: RunAs | Refusal | str | None  # a str: a Refusal whose reason holds it


CASES = [
    pytest.param(Case(0, OsUsers(), "alice", None), id="no-mapping-root-runs-as-itself"),
    pytest.param(Case(1001, OsUsers(), "bob", None), id="no-mapping-user-runs-as-itself"),
    pytest.param(Case(0, MAPPED, "alice", RunAs("alice", ALICE)), id="root-drops-to-mapped"),
    pytest.param(Case(0, MAPPED, "bob", RunAs("bob", BOB)), id="root-drops-to-other-name"),
    pytest.param(Case(0, MAPPED, "admin", None), id="root-mapped-to-root-stays"),
    pytest.param(Case(1001, MAPPED, "alice", None), id="user-runs-its-own-jobs"),
    pytest.param(Case(1001, MAPPED, "bob", "not root"), id="user-refuses-another-users-job"),
    pytest.param(Case(1001, MAPPED, "admin", "not root"), id="user-refuses-a-root-job"),
    pytest.param(Case(0, MAPPED, "carol", "no OS user"), id="unmapped-refused"),
    pytest.param(
        Case(0, OsUsers({"alice": "alice"}, unmapped_as_scheduler=True), "carol", None),
        id="unmapped-allowed-as-scheduler",
    ),
    pytest.param(
        Case(0, OsUsers({"alice": "alice"}, default="bsmith"), "carol", RunAs("carol", BOB)),
        id="unmapped-root-drops-to-default",
    ),
    pytest.param(
        Case(1001, OsUsers(default="bsmith", unmapped_as_scheduler=True), "carol", "not root"),
        id="default-wins-over-the-flag",
    ),
    pytest.param(Case(0, MAPPED, "ghost", "does not exist"), id="unknown-os-user-refused"),
]


@pytest.mark.parametrize("case", CASES)
def test_run_as_decision(case: Case) -> None:
    got = run_as(case.current_uid, case.os_users, case.tally_user, ACCOUNTS)
    if isinstance(case.expected, str):
        assert isinstance(got, Refusal) and case.expected in got.reason
        assert repr(case.tally_user) in got.reason
    else:
        assert got == case.expected


def test_run_as_sets_the_login_variables() -> None:
    assert RunAs("bob", BOB).environment() == {
        "HOME": "/home/bsmith",
        "USER": "bsmith",
        "LOGNAME": "bsmith",
    }


# ---------------------------------------------------------------------------- configuration


def test_identity_config_parses_os_users_and_reverses_slurm_accounts(tmp_path: Path) -> None:
    data = config_data(tmp_path)
    data["identity"] = {
        "os_users": {"users": {"ada": "nobody"}, "default": "daemon"},
        "slurm_accounts": {
            "vis-gpu": {"team": "vision", "project": "detection"},
            "vis-cpu": {"team": "vision"},
            "lang": {"team": "language"},
        },
    }
    identity = parse_config(data, "test.yaml").identity
    assert identity.os_users.mapping() == OsUsers({"ada": "nobody"}, "daemon", False)
    assert slurm_account_of_team(identity.slurm_accounts) == {
        "vision": "vis-gpu",
        "language": "lang",
    }
    assert not IdentityConfig().os_users.mapping().configured


@pytest.mark.parametrize(
    "os_users",
    [
        pytest.param({"users": {"ada": "no:colon"}}, id="colon"),
        pytest.param({"users": {"ada": "-leading-dash"}}, id="leading-dash"),
        pytest.param({"default": "x" * 33}, id="too-long"),
        pytest.param({"unmapped": "refuse"}, id="unknown-key"),
    ],
)
def test_identity_config_refuses_bad_os_users(tmp_path: Path, os_users: dict[str, object]) -> None:
    data = config_data(tmp_path)
    data["identity"] = {"os_users": os_users}
    with pytest.raises(ConfigError, match="os_users"):
        parse_config(data, "test.yaml")


# ---------------------------------------------------------------------------- real processes

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="dropping to another user needs root")


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory `nobody` can reach and write (pytest's own are 0700 under root's)."""
    path = Path(tempfile.mkdtemp(prefix="tally-run-as-"))
    path.chmod(0o777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def a_job(job_id: str, user: str) -> RunningJob:
    return RunningJob(
        spec=a_spec(job_id, user=user),
        flavor=Flavor("main", "A100"),
        gpus=(GpuRef(f"GPU-{job_id}", "node-1"),),
        priority=0,
        preemptible=True,
        admitted_us=0,
    )


def proc_ids(pid: int) -> dict[str, list[int]]:
    """The Uid:, Gid: and Groups: lines of /proc/<pid>/status."""
    out: dict[str, list[int]] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("Uid", "Gid", "Groups"):
            out[key] = [int(v) for v in value.split()]
    return out


def wait_text(path: Path, lines: int, timeout_s: float = 5.0) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""
        if text.count("\n") >= lines:
            return text.splitlines()
        time.sleep(0.02)
    raise AssertionError(f"{path}: fewer than {lines} lines")


@needs_root
def test_as_root_a_job_runs_as_its_submitters_os_user(tmp_path: Path) -> None:
    nobody = account_of("nobody")
    assert nobody is not None and nobody.uid != 0
    ex = LocalExecutor(tmp_path / "logs", os_users=OsUsers({"ada": "nobody"}), grace_s=0.5)
    script = 'id -u; id -g; id -G; echo "$HOME|$USER|$LOGNAME"; exec sleep 30'
    ex.start(a_job("as-nobody", "ada"), Work(command=("/bin/sh", "-c", script), cwd="/"))
    try:
        (running,) = ex.poll()
        assert running.state is RunState.RUNNING
        uid, gid, groups, login = wait_text(ex.log_path("as-nobody"), 4)
        ids = proc_ids(int(running.native_id))  # the leader, now `sleep`
        assert ids["Uid"] == [nobody.uid] * 4  # real, effective, saved, filesystem
        assert ids["Gid"] == [nobody.gid] * 4
        assert sorted(ids["Groups"]) == list(nobody.groups)
        assert (int(uid), int(gid)) == (nobody.uid, nobody.gid)
        assert sorted(int(g) for g in groups.split()) == list(nobody.groups)
        assert login == f"{nobody.home}|nobody|nobody"
    finally:
        (stopped,) = ex.stop(["as-nobody"], StopReason.CANCELLED)
    assert stopped.state is RunState.STOPPED


@needs_root
def test_as_root_a_script_job_runs_as_its_user_from_a_file_it_owns(open_dir: Path) -> None:
    logs = open_dir / "logs"
    ex = LocalExecutor(logs, os_users=OsUsers(default="nobody"))
    ex.start(a_job("script", "ada"), Work(script="#!/bin/sh\nid -un\n", cwd="/"))
    statuses = until_ended(ex, "script")
    assert statuses[-1].state is RunState.FINISHED, ex.log_path("script").read_text()
    assert ex.log_path("script").read_text() == "nobody\n"
    assert (logs / "script.script").stat().st_uid == pwd.getpwnam("nobody").pw_uid


def until_ended(ex: LocalExecutor, job_id: str, timeout_s: float = 5.0) -> list[JobStatus]:
    seen: list[JobStatus] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        seen.extend(ex.poll())
        if seen and seen[-1].state.ended:
            return seen
        time.sleep(0.02)
    raise AssertionError(f"{job_id} did not end: {seen}")


def test_an_unmapped_submitter_is_refused_and_nothing_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    ex = LocalExecutor(tmp_path / "logs", os_users=OsUsers({"ada": "nobody"}))
    ex.start(a_job("carols", "carol"), Work(command=("/bin/touch", str(marker))))
    (failed,) = ex.poll()
    assert (failed.state, failed.exit_code) == (RunState.FAILED, 126)
    assert "Tally user 'carol' has no OS user" in failed.detail
    assert ex.active() == () and not marker.exists()
    assert "refused to start" in ex.log_path("carols").read_text()


def test_a_refused_job_fails_with_the_reason_explain_shows(tmp_path: Path) -> None:
    config = parse_config(config_data(tmp_path), "test.yaml")
    clock = ManualClock(T0_US)
    ex = LocalExecutor(tmp_path / "logs", os_users=OsUsers({"grace": "nobody"}))  # wall clock
    service = SchedulerService(build_dispatcher(config, ex, clock), MemoryPublisher())
    request = SubmitRequest(
        team="vision",
        project="detection",
        user="ada",
        queue="dev",
        gpus=1,
        work=Work(command=("true",)),
    )

    async def go() -> str:
        job_id = (await service.submit(request)).record.job_id
        for _ in range(2):
            await service.tick()
            clock.advance(SECOND_US)
        return job_id

    job_id = asyncio.run(go())
    why = service.dispatcher.explain(job_id)
    assert "failed: exit_nonzero, exit code 126 (refused to start: Tally user 'ada'" in why
    assert "now: failed" in why


@needs_root
def test_not_root_a_job_of_another_os_user_is_refused(open_dir: Path) -> None:
    """In a child that dropped to `nobody`, a job whose submitter maps to `daemon`: refused,
    and the child never ran its command."""
    marker = open_dir / "ran"
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: become nobody, then try
        code = 1
        try:
            os.close(read_end)
            nobody = pwd.getpwnam("nobody")
            os.setgroups([])
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            ex = LocalExecutor(open_dir / "logs", os_users=OsUsers({"ada": "daemon"}))
            ex.start(a_job("daemons", "ada"), Work(command=("/bin/touch", str(marker))))
            said = [f"{s.state}|{s.exit_code}|{s.detail}" for s in ex.poll()]
            os.write(write_end, "\n".join(said).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as reader:
        said = reader.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    state, code, detail = said.split("|", 2)
    assert (state, code) == ("failed", "126")
    assert f"runs as uid {pwd.getpwnam('nobody').pw_uid}, not root" in detail
    assert "'ada' as OS user 'daemon'" in detail
    assert not marker.exists()


# ---------------------------------------------------------------------------- Slurm


def test_slurm_refuses_a_job_it_may_not_run_as_its_submitter(tmp_path: Path) -> None:
    runner = ScriptedRunner({})  # any command would fail the test
    ex = SlurmExecutor(tmp_path, runner=runner, os_users=OsUsers({"someone": "nobody"}))
    ex.start(a_job("unmapped", "carol"), Work(command=("true",)))
    (status,) = ex.poll()
    assert (status.state, status.exit_code) == (RunState.FAILED, 126)
    assert "Tally user 'carol' has no OS user in identity.os_users" in status.detail
    assert runner.calls == []


@needs_root
def test_slurm_submits_as_the_submitters_user_with_the_teams_account(tmp_path: Path) -> None:
    nobody = account_of("nobody")
    assert nobody is not None
    runner = ScriptedRunner({"sbatch": [ok("sbatch", "77\n")]})
    ex = SlurmExecutor(
        tmp_path,
        runner=runner,
        accounts={"vision": "vis-gpu"},
        os_users=OsUsers({"ada": "nobody"}),
    )
    ex.start(a_job("as-nobody", "ada"), Work(command=("true",)))
    (sbatch,) = runner.calls
    assert [a for a in sbatch if a.startswith(("--account", "--uid", "--gid"))] == [
        "--account=vis-gpu",
        "--uid=nobody",
        f"--gid={nobody.gid}",
    ]
    assert ex.slurm_id("as-nobody") == "77"
