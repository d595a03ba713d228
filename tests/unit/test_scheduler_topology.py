"""Topology-aware gangs: named table cases for the pure placement (`scheduler.topology`), and
the same decisions through real scheduling cycles — a job that requires a topology the free
GPUs do not offer waits with `topology_unmet`, which `explain` shows; stale and unhealthy GPUs
are never chosen, however well they would complete a domain."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pytest

from ledger.inventory import GpuHealthState
from ledger.job_events import JobAdmitted, JobPreempted, JobWaiting, WaitReason
from ledger.topology import GpuTopology, TopologyNeed
from scheduler.explain import WAIT_TEXT, explain
from scheduler.inventory import placeable_nodes
from scheduler.lifecycle import finish
from scheduler.model import GpuRef, Node
from scheduler.placement import place
from scheduler.snapshot import Fleet
from scheduler.topology import place_gang
from tests.inventory_builders import a_record
from tests.scheduler_builders import A100, T0_US, a_cluster, a_spec, a_team

NVL = "nvlink_domain"


def a_node(
    name: str,
    gpus: int = 8,
    nvlink: str | None = "",
    numa_split: bool = False,
    pairs: bool = False,
    **where: str,
) -> Node:
    """A node of `gpus` A100s `<name>-<i>`: one NVLink domain `<name>` (`nvlink=""`), the named
    one, or none (None); NVLink pairs `<name>/p<k>` with `pairs`; NUMA nodes 0 and 1 over the
    halves with `numa_split`; `where`: rail / rack for every GPU."""
    topology = []
    for i in range(gpus):
        domain = (f"{name}/p{i // 2}" if pairs else nvlink or name) if nvlink is not None else None
        numa = (i * 2 // gpus) if numa_split else None
        topology.append((f"{name}-{i}", GpuTopology(domain, numa, **where)))
    uuids = tuple(u for u, _ in topology)
    return Node(name, A100.pool, A100.model, uuids, tuple(topology))


def free_of(nodes: Sequence[Node], busy: Sequence[str] = ()) -> dict[str, tuple[str, ...]]:
    free = {n.name: tuple(u for u in n.gpu_uuids if u not in busy) for n in nodes}
    return {n: u for n, u in free.items() if u}


@dataclass(frozen=True)
class Case:
    """Free GPUs of `nodes` (all but `busy`); a gang of `gpus` needing `need`: it gets exactly
    `expect` (UUIDs) or no placement (None)."""

    nodes: tuple[Node, ...]
    gpus: int
    expect: frozenset[str] | None
    busy: tuple[str, ...] = ()
    need: TopologyNeed | None = None
    span: bool = True


def uuids(*names: str) -> frozenset[str]:
    return frozenset(names)


def run(case: Case) -> frozenset[str] | None:
    fleet = Fleet.of(case.nodes)
    chosen = place_gang(
        free_of(case.nodes, case.busy), case.gpus, case.span, case.need, fleet.where
    )
    return None if chosen is None else frozenset(g.uuid for g in chosen)


DGX = tuple(a_node(f"n{k}", numa_split=True, rail=f"r{k % 2}") for k in range(4))
PCIE = (a_node("a", 4, pairs=True),)

CASES: Mapping[str, Case] = {
    "2 GPUs fit one NVLink domain -> same domain": Case(
        PCIE, 2, uuids("a-2", "a-3"), busy=("a-1",)
    ),
    "2 GPUs on one NUMA node of a domain": Case(
        (a_node("n", numa_split=True),), 2, uuids("n-4", "n-5"), busy=("n-0", "n-1", "n-2")
    ),
    "best fit: the fuller domain, the whole one kept for big gangs": Case(
        (a_node("a"), a_node("b")), 2, uuids("b-6", "b-7"), busy=tuple(f"b-{i}" for i in range(6))
    ),
    "8 GPUs across two domains when nvlink not required": Case(
        (a_node("a", 4), a_node("b", 4)),
        8,
        uuids(*(f"a-{i}" for i in range(4)), *(f"b-{i}" for i in range(4))),
    ),
    "require nvlink, free GPUs fragmented -> no placement": Case(
        PCIE, 2, None, busy=("a-1", "a-3"), need=TopologyNeed.NVLINK
    ),
    "require nvlink, one domain holds it": Case(
        PCIE, 2, uuids("a-2", "a-3"), busy=("a-0",), need=TopologyNeed.NVLINK
    ),
    "require nvlink, no domain known -> no placement": Case(
        (a_node("x", 4, nvlink=None),), 2, None, need=TopologyNeed.NVLINK
    ),
    "an NVLink domain spanning two nodes holds a 12-GPU gang": Case(
        (a_node("a", nvlink="nvl72"), a_node("b", nvlink="nvl72"), a_node("c")),
        12,
        uuids(*(f"a-{i}" for i in range(2, 8)), *(f"b-{i}" for i in range(2, 8))),
        busy=("a-0", "a-1", "b-0", "b-1"),
    ),
    "rail preference for 2-node gang": Case(
        DGX,
        16,
        uuids(*(f"n0-{i}" for i in range(8)), *(f"n2-{i}" for i in range(8))),
        busy=("n3-0", "n3-1"),
    ),
    "require rail, no rail has room -> no placement": Case(
        DGX, 16, None, busy=("n0-0", "n1-0"), need=TopologyNeed.RAIL
    ),
    "rack when no rail is known": Case(
        (a_node("a", 4, rack="k1"), a_node("b", 4, rack="k2"), a_node("c", 4, rack="k1")),
        8,
        uuids(*(f"a-{i}" for i in range(4)), *(f"c-{i}" for i in range(4))),
    ),
    "require node, GPUs spread over nodes -> no placement": Case(
        (a_node("a", 4), a_node("b", 4)), 4, None, busy=("a-0", "b-0"), need=TopologyNeed.NODE
    ),
    "a one-node job keeps to one node inside a multi-node domain": Case(
        (a_node("a", 4, nvlink="d"), a_node("b", 4, nvlink="d")),
        4,
        None,
        busy=("a-0", "b-0"),
        span=False,
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_topology_placement(case: Case) -> None:
    assert run(case) == case.expect


@pytest.mark.parametrize(
    ("free", "gpus", "span"),
    [
        pytest.param({"a": ("a-0", "a-1"), "b": ("b-0",)}, 2, True, id="fits-one-node"),
        pytest.param({"a": ("a-0",), "b": ("b-0", "b-1")}, 3, True, id="spans"),
        pytest.param({"a": ("a-0",), "b": ("b-0",)}, 2, False, id="cannot-span"),
    ],
)
def test_without_topology_it_places_as_plain_placement(
    free: dict[str, tuple[str, ...]], gpus: int, span: bool
) -> None:
    assert place_gang(free, gpus, span, None, {}) == place(free, gpus, span)


# ---------------------------------------------------------------------------- in cycles


def test_gangs_pack_domains_and_a_required_one_waits_with_a_reason_explain_shows() -> None:
    cluster = a_cluster(teams=(a_team("vision", 8),), fleet=PCIE)
    for job in ("one", "two"):
        cluster.run(a_spec(job, gpus=1))
    assert [cluster.running(j).gpus[0].uuid for j in ("one", "two")] == ["a-0", "a-1"]  # packed
    cluster.run(a_spec("pair", gpus=2, topology=TopologyNeed.NVLINK))
    assert cluster.running("pair").gpus == (GpuRef("a-2", "a"), GpuRef("a-3", "a"))
    cluster.apply(finish(cluster.running("pair"), cluster.now_us))
    cluster.run(a_spec("three", gpus=1))
    cluster.run(a_spec("four", gpus=1))
    for job in ("two", "four"):  # a-1 and a-3 free: one GPU in each pair
        cluster.apply(finish(cluster.running(job), cluster.now_us))

    cluster.submit(a_spec("nv", gpus=2, topology=TopologyNeed.NVLINK))
    result = cluster.cycle()
    assert cluster.reason("nv") is WaitReason.TOPOLOGY
    (waiting,) = [e for e in result.events if isinstance(e, JobWaiting)]
    assert waiting.detail == (
        "2 GPU(s) of main/A100 in one NVLink domain wanted; at most 1 free in one (2 free in all)"
    )
    text = explain("nv", cluster.log)
    assert WAIT_TEXT[WaitReason.TOPOLOGY] in text and waiting.detail in text
    cluster.run(a_spec("any", gpus=2))  # preferred only: it takes the fragments
    assert {g.uuid for g in cluster.running("any").gpus} == {"a-1", "a-3"}


def test_preemption_frees_a_whole_domain_for_a_required_one_never_a_useless_gpu() -> None:
    cluster = a_cluster(teams=(a_team("vision", 8),), fleet=PCIE)
    for job, priority in (("low0", 0), ("low1", 0), ("mid", 5)):
        cluster.run(a_spec(job, gpus=1, priority=priority))
    held = {j: cluster.running(j).gpus[0].uuid for j in ("low0", "low1", "mid")}
    assert held == {"low0": "a-0", "low1": "a-1", "mid": "a-2"}
    cluster.submit(a_spec("hi", gpus=2, priority=10, topology=TopologyNeed.NVLINK))
    cluster.settle()
    # freeing low1 alone (the first choice) frees two GPUs in two domains: not enough
    assert {g.uuid for g in cluster.running("hi").gpus} == {"a-0", "a-1"}
    preempted = [e.job_id for e in cluster.log if isinstance(e, JobPreempted)]
    assert sorted(preempted) == ["low0", "low1"]
    assert cluster.running("mid").gpus[0].uuid == "a-2"


@pytest.mark.parametrize(
    ("need", "reason"),
    [
        pytest.param(TopologyNeed.NVLINK, WaitReason.NO_MATCHING_GPUS, id="nvlink-never"),
        pytest.param(TopologyNeed.RAIL, WaitReason.NO_MATCHING_GPUS, id="rail-never"),
        pytest.param(None, None, id="preferred-only-runs"),
    ],
)
def test_a_gang_larger_than_any_domain_it_requires_never_fits(
    need: TopologyNeed | None, reason: WaitReason | None
) -> None:
    racks = (a_node("a", 4, pairs=True, rail="r1"), a_node("b", 4, pairs=True, rail="r2"))
    cluster = a_cluster(teams=(a_team("vision", 8),), fleet=racks)
    cluster.submit(a_spec("big", gpus=6, topology=need))
    cluster.cycle()
    assert cluster.reason("big") is reason
    if reason is not None:
        detail = [e.detail for e in cluster.log if isinstance(e, JobWaiting)][-1]
        assert f"in one {'NVLink domain' if need is TopologyNeed.NVLINK else 'rail'}" in detail


def test_stale_and_unhealthy_gpus_are_never_chosen() -> None:
    domain = GpuTopology(nvlink_domain="d", numa_node=0)
    other = GpuTopology(nvlink_domain="e", numa_node=1)
    records = [
        a_record("g0", index=0, model="A100", pool="main", topology=domain),
        a_record("g1", index=1, model="A100", pool="main", topology=domain, last_seen_us=0),
        a_record(
            "g2",
            index=2,
            model="A100",
            pool="main",
            topology=domain,
            health=GpuHealthState.UNHEALTHY,
        ),
        a_record("g3", index=3, model="A100", pool="main", topology=other),
        a_record("g4", index=4, model="A100", pool="main", topology=other),
    ]
    fleet = placeable_nodes(records, T0_US, 6)
    assert [n.gpu_uuids for n in fleet] == [("g0", "g3", "g4")]
    cluster = a_cluster(teams=(a_team("vision", 8),), fleet=fleet)
    cluster.submit(a_spec("j", gpus=2, topology=TopologyNeed.NVLINK))
    admitted = [e for e in cluster.cycle().events if isinstance(e, JobAdmitted)]
    assert [e.gpu_uuids for e in admitted] == [("g3", "g4")]
    cluster.run(a_spec("k", gpus=1, topology=TopologyNeed.NVLINK))
    assert cluster.running("k").gpus == (GpuRef("g0", "node-01"),)  # never g1 nor g2
    cluster.submit(a_spec("l", gpus=1))
    cluster.cycle()
    assert cluster.reason("l") is WaitReason.NO_CAPACITY  # g1 (stale), g2 (unhealthy) unused
