"""The scheduler state: a projection of the `jobs` topic that refuses impossible events."""

from dataclasses import fields, replace

import pytest

from ledger.job_events import (
    GpuAssigned,
    GpuReleased,
    JobAdmitted,
    JobSubmitted,
    WaitReason,
)
from scheduler.errors import ConfigError, SchedulerError, StateError
from scheduler.model import Flavor, Node, Policy, Quota, Team
from scheduler.quota import UNITS
from scheduler.state import SchedulerState
from tests.scheduler_builders import A100, T0_US, a_cluster, a_queue, a_spec, a_team, nodes


def _assigned(uuid: str = "GPU-a100-00-0", job_id: str = "j") -> GpuAssigned:
    return GpuAssigned(
        gpu_uuid=uuid,
        node="a100-00",
        pool=A100.pool,
        model=A100.model,
        job_id=job_id,
        team="vision",
        project="p",
        user="u",
        time_us=T0_US,
    )


def _released(uuid: str = "GPU-a100-00-0", job_id: str = "j") -> GpuReleased:
    a = _assigned(uuid, job_id)
    return GpuReleased(**{f.name: getattr(a, f.name) for f in fields(a) if f.name != "share"})


def test_a_gpu_cannot_be_assigned_twice() -> None:
    cluster = a_cluster()
    cluster.apply([_assigned(job_id="one")])
    with pytest.raises(StateError, match="held by one"):
        cluster.state.apply(_assigned(job_id="two"))
    assert cluster.state.holder("GPU-a100-00-0") == "one"
    assert cluster.state.used("vision", A100) == UNITS


def test_only_the_holder_releases_a_gpu() -> None:
    cluster = a_cluster()
    cluster.apply([_assigned(job_id="one")])
    with pytest.raises(StateError, match="held by one"):
        cluster.state.apply(_released(job_id="two"))
    with pytest.raises(StateError, match="nobody"):
        cluster.state.apply(_released(uuid="GPU-a100-00-1", job_id="one"))


def test_a_gpu_outside_the_fleet_is_held_where_the_event_says_and_never_freed() -> None:
    state = a_cluster().state
    free = state.free_total(A100)
    state.apply(_assigned(uuid="GPU-elsewhere"))  # e.g. replayed before the inventory is read
    assert state.holder("GPU-elsewhere") == "j" and state.used("vision", A100) == UNITS
    state.apply(_released(uuid="GPU-elsewhere"))
    assert state.holder("GPU-elsewhere") is None and state.used("vision", A100) == 0
    assert state.free_total(A100) == free and not state.placeable("GPU-elsewhere")


def test_admitting_a_job_that_is_not_pending_is_refused() -> None:
    cluster = a_cluster()
    admitted = JobAdmitted(
        "ghost", "vision", "train", "main", "A100", (), (), 0, 0, True, 0, 0, 1, T0_US
    )
    with pytest.raises(StateError, match="not pending"):
        cluster.state.apply(admitted)


def test_a_duplicate_submission_is_ignored() -> None:
    cluster = a_cluster()
    cluster.run(a_spec("j", "vision"))
    cluster.submit(a_spec("j", "vision"))
    assert cluster.state.pending_count == 0 and cluster.state.running_count == 1


def test_replaying_the_events_rebuilds_the_same_state() -> None:
    cluster = a_cluster()
    cluster.submit(
        *(
            a_spec(f"j{i}", "vision" if i % 2 else "audio", gpus=1 + i % 3, submit_us=T0_US + i)
            for i in range(20)
        )
    )
    cluster.settle()
    replayed = a_cluster()
    replayed.apply(cluster.log)
    a, b = cluster.snapshot(), replayed.snapshot()
    assert a.usage == b.usage
    assert {f: dict(g.by_node) for f, g in a.free.items()} == {
        f: dict(g.by_node) for f, g in b.free.items()
    }
    assert a.heads == b.heads
    assert a.running == b.running


def test_backlogs_are_ordered_by_priority_then_age() -> None:
    cluster = a_cluster()
    cluster.submit(
        a_spec("late", "vision", submit_us=T0_US + 2),
        a_spec("early", "vision", submit_us=T0_US + 1),
        a_spec("urgent", "vision", submit_us=T0_US + 3, priority=5),
    )
    heads = [h.spec.job_id for h in cluster.snapshot().heads]
    assert heads == ["urgent", "early", "late"]


def test_snapshot_heads_are_limited_per_queue() -> None:
    cluster = a_cluster()
    cluster.submit(*(a_spec(f"v{i}", "vision", submit_us=T0_US + i) for i in range(5)))
    cluster.submit(*(a_spec(f"a{i}", "audio", submit_us=T0_US + i) for i in range(5)))
    heads = cluster.state.snapshot(T0_US, heads_per_queue=2).heads
    assert sorted(h.spec.job_id for h in heads) == ["a0", "a1", "v0", "v1"]


def test_a_snapshot_does_not_change_when_the_state_does() -> None:
    cluster = a_cluster()
    cluster.submit(a_spec("j", "vision", gpus=4))
    snap = cluster.snapshot()
    cluster.cycle()
    assert snap.used("vision", A100) == 0
    assert snap.free_in(A100).total == 16
    assert [h.spec.job_id for h in snap.heads] == ["j"]


@pytest.mark.parametrize(
    "build",
    [
        pytest.param(lambda: SchedulerState([a_queue(), a_queue()], [], []), id="queue-twice"),
        pytest.param(lambda: SchedulerState([], [a_team("v"), a_team("v")], []), id="team-twice"),
        pytest.param(lambda: SchedulerState([], [], nodes() + nodes()), id="node-twice"),
        pytest.param(
            lambda: SchedulerState([], [], [Node("x", "p", "m", ("G", "G"))]), id="gpu-twice"
        ),
        pytest.param(
            lambda: Team("v", (Quota(A100, 1), Quota(A100, 2))), id="two-quotas-one-flavor"
        ),
        pytest.param(lambda: Quota(A100, -1), id="negative-quota"),
        pytest.param(lambda: a_queue(max_retries=-1), id="negative-retries"),
        pytest.param(lambda: SchedulerState([], [], [], half_life_us=0), id="zero-half-life"),
    ],
)
def test_invalid_configuration_raises_config_error(build: object) -> None:
    with pytest.raises(ConfigError):
        build()  # type: ignore[operator]


def test_every_scheduler_error_is_a_scheduler_error() -> None:
    assert issubclass(ConfigError, SchedulerError) and issubclass(StateError, SchedulerError)


def test_job_submitted_keeps_the_spec() -> None:
    cluster = a_cluster()
    spec = a_spec("j", "vision", model="A100", gpus=2)
    cluster.apply([JobSubmitted(spec, T0_US)])
    pending = cluster.state.pending_job("j")
    assert pending is not None and pending.spec == spec
    assert replace(spec, gpus=3) != pending.spec


def test_jobs_that_can_never_run_are_parked_out_of_the_heads() -> None:
    cluster = a_cluster(policy=Policy(heads_per_queue=2))
    never = [a_spec(f"huge{i}", "vision", gpus=64, submit_us=T0_US + i) for i in range(2)]
    cluster.submit(*never, a_spec("small", "vision", submit_us=T0_US + 5))
    cluster.cycle()
    assert cluster.reason("huge0") is WaitReason.NO_MATCHING_GPUS
    assert cluster.state.pending_count == 3  # still pending, visible to explain and cancel
    cluster.cycle()
    assert cluster.state.running_job("small") is not None
    cluster.state.unpark()
    assert [h.spec.job_id for h in cluster.snapshot().heads] == ["huge0", "huge1"]
    cluster.cycle()
    assert [h.spec.job_id for h in cluster.snapshot().heads] == []


def test_a_new_fleet_keeps_held_gpus_held_and_frees_a_released_gpu_only_if_placeable() -> None:
    state = a_cluster().state
    state.apply(_assigned("GPU-a100-00-0", job_id="one"))
    state.set_fleet(())  # every GPU went stale
    assert state.free_total(A100) == 0 and state.holder("GPU-a100-00-0") == "one"
    state.apply(_released("GPU-a100-00-0", job_id="one"))
    assert state.free_total(A100) == 0 and state.used("vision", A100) == 0
    state.set_fleet([Node("a100-00", A100.pool, A100.model, ("GPU-a100-00-0", "GPU-a100-00-1"))])
    assert state.free_total(A100) == 2 and state.placeable("GPU-a100-00-1")
    assert A100 in state.known_flavors()


def test_known_flavors_follow_the_gpus_home_a_node_moved_to_another_pool_takes_its_flavor() -> None:
    state = a_cluster(fleet=[Node("n0", "old", "A100", ("GPU-0", "GPU-1"))]).state
    assert state.known_flavors() == {Flavor("old", "A100")}
    state.set_fleet([Node("n0", "new", "A100", ("GPU-0", "GPU-1"))])  # the operator moved it
    assert state.known_flavors() == {Flavor("new", "A100")}
    state.apply(_assigned("GPU-9", job_id="replayed"))  # a GPU no inventory named yet
    assert state.known_flavors() == {Flavor("new", "A100"), A100}
