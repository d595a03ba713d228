"""Slurm jobs Tally did not submit: the account (job environment, else a real `scontrol`-shaped
executable) mapped to team and project, an unknown account to `unmapped:<account>`."""

from __future__ import annotations

import logging
import stat
from pathlib import Path

import pytest

from collectors.ownership import OwnerResolver, parse_environ
from collectors.slurm_account import SlurmAccounts, account_owner, parse_scontrol_account
from ledger.attribution import attribute_sample
from ledger.events import Owner, envelope_for
from ledger.periods import period_label
from ledger.pricing import Price, PriceBook
from ledger.read.reports import ReportQueries, cost_report
from ledger.store.hot import DuckDBStore
from ledger.store.port import OffsetRange, SourcedTransaction
from tests.builders import T0_US, a_process, a_sample

GPU = "GPU-00000000-0000-4000-8000-000000000000"
ACCOUNTS = {"ml-research": ("vision", "detection"), "nlp": ("language", None)}

SCONTROL_501 = """\
JobId=501 JobName=train.sh
   UserId=grace(1001) GroupId=grace(1001) MCS_label=N/A
   Priority=4294901757 Nice=0 Account=ml-research QOS=normal
   JobState=RUNNING Reason=None Dependency=(null)
   Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0
   RunTime=00:12:31 TimeLimit=1-00:00:00 TimeMin=N/A
   SubmitTime=2026-12-01T10:02:11 EligibleTime=2026-12-01T10:02:11
   Partition=gpu AllocNode:Sid=login01:81234
   NodeList=gpu-node-07 BatchHost=gpu-node-07
   NumNodes=1 NumCPUs=16 NumTasks=1 CPUs/Task=16 ReqB:S:C:T=0:0:*:*
   TRES=cpu=16,mem=128G,node=1,billing=16,gres/gpu=2
   Command=/home/grace/train.sh
   WorkDir=/home/grace
   StdOut=/home/grace/slurm-501.out
   TresPerNode=gres:gpu:2
"""
SCONTROL_4242_ONELINE = (
    "JobId=4242 JobName=sweep UserId=ada(1000) GroupId=ada(1000) MCS_label=N/A "
    "Priority=1 Nice=0 Account=astro QOS=normal JobState=RUNNING Reason=None "
    "Partition=gpu NodeList=gpu-node-07 TresPerNode=gres:gpu:1\n"
)


def _scontrol(tmp_path: Path) -> tuple[Path, Path]:
    """An executable that answers `show job <id>` as scontrol does, and logs each call."""
    calls = tmp_path / "calls"
    (tmp_path / "501.txt").write_text(SCONTROL_501)
    (tmp_path / "4242.txt").write_text(SCONTROL_4242_ONELINE)
    script = tmp_path / "scontrol"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {calls}\n'
        '[ "$1 $2" = "show job" ] || { echo "invalid entity: $1" >&2; exit 1; }\n'
        f'f={tmp_path}/"$3".txt\n'
        'if [ -f "$f" ]; then cat "$f"; else\n'
        '  echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1; fi\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script, calls


def _proc(root: Path, pid: int, environ: bytes | None, cgroup: str | None = None) -> None:
    base = root / str(pid)
    base.mkdir(parents=True)
    if environ is not None:
        (base / "environ").write_bytes(environ)
    if cgroup is not None:
        (base / "cgroup").write_text(cgroup)
    (base / "status").write_text("Name:\tpython\nUid:\t1000\t1000\t1000\t1000\n")


@pytest.mark.parametrize(
    ("text", "account"),
    [
        pytest.param(SCONTROL_501, "ml-research", id="multi-line"),
        pytest.param(SCONTROL_4242_ONELINE, "astro", id="one-line"),
        pytest.param("JobId=7 Account=(null) QOS=normal", None, id="null"),
        pytest.param("JobId=7 AdminComment=Account=x QOS=normal", None, id="not-a-field"),
        pytest.param("JobId=7 JobName=x", None, id="no-account"),
        pytest.param("", None, id="empty"),
    ],
)
def test_parse_scontrol_account(text: str, account: str | None) -> None:
    assert parse_scontrol_account(text) == account


@pytest.mark.parametrize(
    ("account", "owner"),
    [
        pytest.param("ml-research", ("vision", "detection"), id="mapped"),
        pytest.param("nlp", ("language", None), id="mapped-team-only"),
        pytest.param("physics", ("unmapped:physics", None), id="unknown"),
    ],
)
def test_account_owner(account: str, owner: tuple[str, str | None]) -> None:
    assert account_owner(account, ACCOUNTS) == owner


def test_environment_account_is_parsed() -> None:
    env = parse_environ(b"SLURM_JOB_ID=500\0SLURM_JOB_ACCOUNT=nlp\0")
    assert env is not None
    assert (env.job_id, env.slurm_account) == ("slurm:500", "nlp")


@pytest.mark.parametrize(
    ("environ", "cgroup", "owner"),
    [
        pytest.param(
            b"SLURM_JOB_ID=500\0SLURM_JOB_ACCOUNT=ml-research\0SLURM_JOB_USER=grace\0",
            None,
            Owner(team="vision", project="detection", user="grace", job_id="slurm:500"),
            id="env-account",
        ),
        pytest.param(
            b"SLURM_JOB_ID=500\0SLURM_JOB_ACCOUNT=physics\0SLURM_JOB_USER=grace\0",
            None,
            Owner(team="unmapped:physics", user="grace", job_id="slurm:500"),
            id="env-account-unknown",
        ),
        pytest.param(
            b"SLURM_JOB_ID=501\0SLURM_JOB_USER=grace\0TALLY_PROJECT=seg\0",
            None,
            Owner(team="vision", project="detection", user="grace", job_id="slurm:501"),
            id="scontrol-account",
        ),
        pytest.param(
            None,
            "0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0",
            Owner(team="unmapped:astro", user="ada", job_id="slurm:4242"),
            id="cgroup-job-scontrol-unknown-account",
        ),
        pytest.param(
            b"SLURM_JOB_ID=999\0SLURM_JOB_USER=grace\0",
            None,
            Owner(user="grace", job_id="slurm:999"),
            id="job-slurm-forgot",
        ),
        pytest.param(
            b"TALLY_JOB_ID=j-7\0SLURM_JOB_ID=501\0SLURM_JOB_ACCOUNT=ml-research\0",
            None,
            Owner(user="ada", job_id="j-7"),
            id="tally-job-left-to-the-ledger",
        ),
        pytest.param(
            b"SLURM_JOB_ID=500\0SLURM_JOB_ACCOUNT=nlp\0TALLY_TEAM=spoofed\0TALLY_PROJECT=p\0",
            None,
            Owner(team="language", project="p", user="ada", job_id="slurm:500"),
            id="account-beats-env-team",
        ),
    ],
)
def test_slurm_job_owner(
    tmp_path: Path, environ: bytes | None, cgroup: str | None, owner: Owner
) -> None:
    script, _ = _scontrol(tmp_path)
    _proc(tmp_path / "proc", 10, environ, cgroup)
    resolver = OwnerResolver(
        tmp_path / "proc",
        user_name={1000: "ada"}.get,
        slurm_account=SlurmAccounts((str(script),)),
        accounts=ACCOUNTS,
    )
    assert resolver(10, GPU) == owner


def test_registry_team_wins_over_the_account(tmp_path: Path) -> None:
    script, calls = _scontrol(tmp_path)
    _proc(tmp_path / "proc", 11, b"SLURM_JOB_ID=501\0SLURM_JOB_USER=grace\0")
    resolver = OwnerResolver(
        tmp_path / "proc",
        lookup={"slurm:501": Owner(team="language", project="pretraining")}.get,
        slurm_account=SlurmAccounts((str(script),)),
        accounts=ACCOUNTS,
    )
    assert resolver(11, GPU) == Owner("language", "pretraining", "grace", "slurm:501")
    assert not calls.exists()  # Slurm is not asked when the registry knows the team


def test_scontrol_answers_are_cached_per_job_within_a_bound(tmp_path: Path) -> None:
    script, calls = _scontrol(tmp_path)
    accounts = SlurmAccounts((str(script),), max_cached=1)
    assert [accounts("501"), accounts("501"), accounts("999"), accounts("999")] == [
        "ml-research",
        "ml-research",
        None,
        None,
    ]
    assert calls.read_text().splitlines() == ["show job 501", "show job 999"]
    assert accounts("501") == "ml-research"  # 999 pushed 501 out: asked again
    assert len(calls.read_text().splitlines()) == 3
    assert accounts("501; rm -rf /") is None  # not a job id: never passed to the command
    assert len(calls.read_text().splitlines()) == 3


def test_a_host_without_scontrol_is_not_an_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    accounts = SlurmAccounts((str(tmp_path / "no-such-scontrol"),))
    with caplog.at_level(logging.INFO, "tally.collector.slurm"):
        assert accounts("501") is None
        assert accounts("502") is None
    assert [r.getMessage() for r in caplog.records] == [
        f"{tmp_path / 'no-such-scontrol'} not found: Slurm accounts come from job environments"
    ]


def test_an_unmapped_account_is_a_visible_team_in_the_cost_report(tmp_path: Path) -> None:
    """The owner the collector gives reaches `tally report cost` as `unmapped:<account>`."""
    _proc(tmp_path / "proc", 12, b"SLURM_JOB_ID=600\0SLURM_JOB_ACCOUNT=physics\0USER=ada\0")
    owner = OwnerResolver(tmp_path / "proc", accounts=ACCOUNTS)(12, GPU)
    sample = a_sample(processes=(a_process(owner=owner),))  # 10 s on one H100
    prices = PriceBook((Price("NVIDIA H100 80GB HBM3", 3_600_000, 0, None),))
    txn = attribute_sample(envelope_for(sample, "nvml://node-01"), prices, {})
    with DuckDBStore(tmp_path / "ledger") as store:
        item = SourcedTransaction(txn, "samples", 0, 0)
        store.commit("inc", [OffsetRange("samples", 0, 0, 0)], [item])
        store.seal()
    queries = ReportQueries(tmp_path / "ledger")
    try:
        report = cost_report(queries, ("team", "job_id"), period_label(T0_US))
    finally:
        queries.close()
    assert [(line.keys, line.gpu_ms, line.money_micros) for line in report.lines] == [
        (("unmapped:physics", "slurm:600"), 10_000, 10_000)
    ]
    assert (report.unallocated_gpu_ms, report.unallocated_micros) == (0, 0)
