"""Fractional requests through the real scheduling cycle (Kueue-style table tests): MIG instances
placed on the layout the inventory reported, quotas per MIG profile, GPU shares packed onto
GPUs up to one whole GPU and never onto a GPU a whole-GPU job holds."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from ledger.job_events import JobAdmitted, JobPreempted, WaitReason
from scheduler.health import unhealthy_decisions
from scheduler.inventory import placeable_nodes
from scheduler.lifecycle import finish
from scheduler.model import Flavor, Policy, QueueClass, Quota, Team
from scheduler.quota import UNITS
from tests.inventory_builders import a_mig_slice, a_record
from tests.scheduler_builders import T0_US, Cluster, a_cluster, a_queue, a_spec

WHOLE = Flavor("a100", "A100")
MIG_1G = Flavor("a100", "A100/1g.10gb")
MIG_3G = Flavor("a100", "A100/3g.40gb")
MIG_2G = Flavor("a100", "A100/2g.20gb")


def fleet() -> tuple:
    """node-01: one A100 carved 3g.40gb + 2g.20gb + two 1g.10gb (7 of 7 slices); node-02: two
    whole A100s."""
    carved = a_record(
        "GPU-M",
        node="node-01",
        pool="a100",
        model="A100",
        mig_mode=True,
        mig=(
            a_mig_slice(1, "3g.40gb", 3),
            a_mig_slice(5, "2g.20gb", 2),
            a_mig_slice(13, "1g.10gb", 1),
            a_mig_slice(14, "1g.10gb", 1),
        ),
    )
    whole = [
        a_record(f"GPU-W{i}", node="node-02", index=i, pool="a100", model="A100") for i in (1, 2)
    ]
    return placeable_nodes([carved, *whole], T0_US, 6)


def team(name: str, **nominal: int) -> Team:
    flavors = {"whole": WHOLE, "g1": MIG_1G, "g3": MIG_3G, "g2": MIG_2G}
    quotas = tuple(Quota(flavors[k], n) for k, n in nominal.items())
    return Team(name, quotas, cohort=None)


def cluster(*teams: Team) -> Cluster:
    queues = (
        a_queue("train"),
        a_queue("dev", QueueClass.DEV),
        a_queue("serve", QueueClass.INFERENCE),
    )
    return a_cluster(
        teams=teams or (team("vision", whole=8, g1=2, g3=1), team("audio", whole=2, g1=2)),
        queues=queues,
        fleet=fleet(),
        policy=Policy(preemption=False),
    )


def admitted(c: Cluster, job_id: str) -> JobAdmitted:
    found = [e for e in c.log if isinstance(e, JobAdmitted) and e.job_id == job_id]
    assert found, f"{job_id} was not admitted: {c.waiting_reasons()}"
    return found[-1]


def test_the_inventory_offers_each_mig_instance_and_never_the_carved_gpu_whole() -> None:
    by_flavor = {(n.flavor, n.name): n.gpu_uuids for n in fleet()}
    assert by_flavor == {
        (MIG_1G, "node-01/A100/1g.10gb"): ("GPU-M/gi13", "GPU-M/gi14"),
        (MIG_2G, "node-01/A100/2g.20gb"): ("GPU-M/gi5",),
        (MIG_3G, "node-01/A100/3g.40gb"): ("GPU-M/gi1",),
        (WHOLE, "node-02"): ("GPU-W1", "GPU-W2"),
    }


# ---------------------------------------------------------------------------- MIG


@dataclass(frozen=True)
class MigCase:
    running: tuple[tuple[str, str, str | None, int], ...]  # (job, team, profile, count) first
    job: tuple[str, str | None, int]  # (team, profile, count) of the job judged
    gpus: tuple[str, ...] | None  # where it goes, or None: it waits
    reason: WaitReason | None = None


MIG_CASES = {
    "fits-on-free-mig-instances": MigCase(
        (), ("vision", "1g.10gb", 2), ("GPU-M/gi13", "GPU-M/gi14")
    ),
    "a-larger-profile-on-its-own-instance": MigCase((), ("vision", "3g.40gb", 1), ("GPU-M/gi1",)),
    "profile-not-present-never-fits": MigCase(
        (), ("vision", "4g.40gb", 1), None, WaitReason.NO_MATCHING_GPUS
    ),
    "more-instances-than-the-layout-has": MigCase(
        (), ("vision", "3g.40gb", 2), None, WaitReason.NO_MATCHING_GPUS
    ),
    "profile-busy-waits-for-capacity": MigCase(
        (("a-1", "audio", "1g.10gb", 2),), ("vision", "1g.10gb", 1), None, WaitReason.NO_CAPACITY
    ),
    "quota-per-profile-exhausted-waits": MigCase(
        (("v-1", "vision", "3g.40gb", 1),),
        ("vision", "3g.40gb", 1),
        None,
        WaitReason.QUOTA_EXHAUSTED,
    ),
    "no-quota-for-the-profile": MigCase(
        (), ("audio", "3g.40gb", 1), None, WaitReason.NO_MATCHING_GPUS
    ),
    "a-whole-gpu-job-never-lands-on-the-carved-gpu": MigCase(
        (), ("vision", None, 3), None, WaitReason.NO_MATCHING_GPUS
    ),
    "a-whole-gpu-job-takes-whole-gpus": MigCase((), ("vision", None, 2), ("GPU-W1", "GPU-W2")),
}


@pytest.mark.parametrize("case", MIG_CASES.values(), ids=MIG_CASES.keys())
def test_mig_requests(case: MigCase) -> None:
    c = cluster()
    for job_id, owner, profile, count in case.running:
        c.run(a_spec(job_id, owner, gpus=count, mig_profile=profile))
    owner, profile, count = case.job
    c.submit(a_spec("job-x", owner, gpus=count, mig_profile=profile))
    c.settle()
    if case.gpus is None:
        assert c.reason("job-x") is case.reason
        return
    event = admitted(c, "job-x")
    assert event.gpu_uuids == case.gpus
    assert event.model == ("A100" if profile is None else f"A100/{profile}")


def test_a_quota_per_profile_counts_instances_apart_from_whole_gpus() -> None:
    c = cluster(team("vision", whole=2, g1=1, g3=1))
    c.run(a_spec("v-1", gpus=1, mig_profile="1g.10gb"), a_spec("v-2", gpus=2))
    c.submit(a_spec("v-3", gpus=1, mig_profile="1g.10gb"))
    c.settle()
    assert c.reason("v-3") is WaitReason.QUOTA_EXHAUSTED
    assert c.state.used("vision", MIG_1G) == UNITS and c.state.used("vision", WHOLE) == 2 * UNITS
    c.submit(a_spec("v-4", gpus=1, mig_profile="3g.40gb"))
    c.settle()
    assert admitted(c, "v-4").gpu_uuids == ("GPU-M/gi1",)


def test_a_busy_instance_is_given_to_the_waiting_job_when_released() -> None:
    c = cluster()
    c.run(a_spec("a-1", "audio", gpus=2, mig_profile="1g.10gb"))
    c.submit(a_spec("v-1", gpus=1, mig_profile="1g.10gb"))
    c.settle()
    assert c.reason("v-1") is WaitReason.NO_CAPACITY
    c.apply(finish(c.running("a-1"), c.now_us))
    c.settle()
    assert admitted(c, "v-1").gpu_uuids == ("GPU-M/gi13",)


# ---------------------------------------------------------------------------- shares


@dataclass(frozen=True)
class ShareCase:
    whole: int  # GPUs a whole-GPU job holds first
    shares: tuple[int, ...]  # per-mille, submitted in order to the dev queue
    placed: tuple[str | None, ...]  # the GPU each share lands on (None: it waits)


SHARE_CASES = {
    "four-quarters-pack-onto-one-gpu": ShareCase(0, (250,) * 4, ("GPU-W1",) * 4),
    "the-fifth-quarter-opens-the-next-gpu": ShareCase(0, (250,) * 5, ("GPU-W1",) * 4 + ("GPU-W2",)),
    "shares-never-sum-past-one-gpu": ShareCase(0, (600, 500, 400), ("GPU-W1", "GPU-W2", "GPU-W1")),
    "never-on-a-gpu-a-whole-job-holds": ShareCase(1, (500, 500), ("GPU-W2", "GPU-W2")),
    "no-room-left-waits": ShareCase(1, (500, 500, 250), ("GPU-W2", "GPU-W2", None)),
    "no-gpu-free-at-all-waits": ShareCase(2, (1,), (None,)),
}


@pytest.mark.parametrize("case", SHARE_CASES.values(), ids=SHARE_CASES.keys())
def test_gpu_shares(case: ShareCase) -> None:
    c = cluster()
    if case.whole:
        c.run(a_spec("whole", "audio", gpus=case.whole))
    for i, share in enumerate(case.shares):
        c.submit(a_spec(f"s-{i}", queue="dev", gpu_share=share, submit_us=T0_US + i))
        c.cycle()
    for i, gpu in enumerate(case.placed):
        job = c.state.running_job(f"s-{i}")
        if gpu is None:
            assert job is None and c.reason(f"s-{i}") is WaitReason.NO_CAPACITY
        else:
            assert job is not None and job.gpus[0].uuid == f"{gpu}/share/s-{i}"
    if case.whole:
        assert c.state.holder("GPU-W1") == "whole"


def test_a_gpu_running_shares_is_not_free_for_whole_jobs_until_the_last_share_ends() -> None:
    c = cluster()
    c.run(a_spec("s-1", queue="serve", gpu_share=500), a_spec("s-2", queue="serve", gpu_share=250))
    assert {c.running(j).gpus[0].uuid.split("/")[0] for j in ("s-1", "s-2")} == {"GPU-W1"}
    c.submit(a_spec("whole", gpus=2))
    c.settle()
    assert c.reason("whole") is WaitReason.NO_CAPACITY
    c.apply(finish(c.running("s-1"), c.now_us))
    c.settle()
    assert c.reason("whole") is WaitReason.NO_CAPACITY
    c.apply(finish(c.running("s-2"), c.now_us))
    c.settle()
    assert admitted(c, "whole").gpu_uuids == ("GPU-W1", "GPU-W2")


def test_a_share_in_a_training_queue_waits_with_its_reason() -> None:
    c = cluster()
    c.submit(a_spec("s-1", queue="train", gpu_share=250))
    c.settle()
    assert c.reason("s-1") is WaitReason.NO_MATCHING_GPUS
    assert "does not take GPU shares" in c.log[-1].detail  # type: ignore[union-attr]


def test_jobs_on_instances_and_shares_of_an_unhealthy_gpu_are_stopped() -> None:
    c = cluster()
    c.run(
        a_spec("mig", gpus=2, mig_profile="1g.10gb"),
        a_spec("share", queue="dev", gpu_share=250),
        a_spec("other", "audio", queue="dev", gpu_share=250, submit_us=T0_US + 1),
    )
    c.apply(finish(c.running("other"), c.now_us))  # its GPU is free again; "share" keeps W1
    events = unhealthy_decisions({"GPU-M": "XID 79", "GPU-W1": "XID 48"}, c.snapshot())
    stopped = {e.job_id: e.by for e in events if isinstance(e, JobPreempted)}
    assert stopped == {"mig": "GPU-M", "share": "GPU-W1"}
