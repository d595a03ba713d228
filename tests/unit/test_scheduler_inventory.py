"""The scheduler places only on the GPUs the collectors report: the inventory topic folded
(`scheduler.inventory`), which GPUs are placeable at a moment (pure), the service's decisions as
GPUs appear, go stale and come back, and `GET /v1/inventory`."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from ledger.inventory import encode_record
from ledger.job_events import JobAdmitted, JobWaiting, WaitReason
from scheduler.executors.fake import RUNS_FOREVER
from scheduler.inventory import FleetInventory, placeable_nodes
from scheduler.model import Node
from scheduler.service import SchedulerService
from tally.scheduling import build_dispatcher
from tests.inventory_builders import a_record
from tests.unit.test_scheduler_api_support import ADMIN, VISION, Api
from tests.unit.test_scheduler_service_support import SECOND_US, T0_US, Rig

STALE_AFTER = 6
INTERVAL = 10 * SECOND_US  # the records' sampling interval (`a_record`)


def a100(uuid: str, node: str = "node-01", index: int = 0, seen: int = T0_US, **kw: object):
    return a_record(
        uuid, node=node, index=index, pool="a100", model="A100", last_seen_us=seen, **kw
    )


# ---------------------------------------------------------------------------- pure


@dataclass(frozen=True)
class Case:
    records: tuple[object, ...]
    now_us: int
    nodes: tuple[Node, ...]


CASES = {
    "nothing-reported-nothing-placeable": Case((), T0_US, ()),
    "live-gpus-by-node": Case(
        (a100("GPU-1", index=1), a100("GPU-0"), a100("GPU-9", "node-02")),
        T0_US,
        (
            Node("node-01", "a100", "A100", ("GPU-0", "GPU-1")),
            Node("node-02", "a100", "A100", ("GPU-9",)),
        ),
    ),
    "a-stale-gpu-is-left-out": Case(
        (a100("GPU-0"), a100("GPU-1", seen=T0_US + 2 * INTERVAL)),
        T0_US + (STALE_AFTER + 1) * INTERVAL,
        (Node("node-01", "a100", "A100", ("GPU-1",)),),
    ),
    "two-flavors-on-one-node-are-two-nodes": Case(
        (a100("GPU-0"), a_record("GPU-5", node="node-01", pool="h100", model="H100")),
        T0_US,
        (
            Node("node-01/A100", "a100", "A100", ("GPU-0",)),
            Node("node-01/H100", "h100", "H100", ("GPU-5",)),
        ),
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_placeable_nodes(case: Case) -> None:
    assert placeable_nodes(case.records, case.now_us, STALE_AFTER) == case.nodes  # type: ignore[arg-type]


def test_the_topic_keeps_each_gpus_newest_record_and_skips_what_it_cannot_read() -> None:
    inventory = FleetInventory(STALE_AFTER)
    newer = a100("GPU-0", index=3, seen=T0_US + INTERVAL)
    for value in (encode_record(newer), encode_record(a100("GPU-0")), b"garbage", None):
        inventory.on_record(value)
    assert inventory.gpus == {"GPU-0": newer} and inventory.device_ids == {"GPU-0": "3"}
    assert (inventory.records, inventory.refused) == (4, 1)


# ---------------------------------------------------------------------------- the service


class InventoryRig(Rig):
    """The rig with the service's fleet following an inventory, as `tally scheduler run`."""

    def __init__(self, tmp) -> None:
        super().__init__(tmp)
        self.inventory = FleetInventory(STALE_AFTER)
        self.dispatcher = build_dispatcher(
            self.config, self.executor, self.clock, inventory=self.inventory
        )
        self.service = SchedulerService(self.dispatcher, self.publisher, inventory=self.inventory)

    def report(self, *uuids: str) -> None:
        for index, uuid in enumerate(uuids):
            self.inventory.on_record(
                encode_record(a100(uuid, index=index, seen=self.clock.now_us()))
            )


def test_jobs_go_only_to_reported_gpus_and_never_to_stale_ones(tmp_path) -> None:
    asyncio.run(_placements(InventoryRig(tmp_path)))


async def _placements(rig: InventoryRig) -> None:
    rig.executor.default = RUNS_FOREVER
    first = await rig.submit(gpus=1)
    waited = await rig.ticks(1)
    assert [e.reason for e in waited if isinstance(e, JobWaiting)] == [WaitReason.NO_MATCHING_GPUS]

    rig.report("GPU-0", "GPU-1")
    admitted = [e for e in await rig.ticks(1) if isinstance(e, JobAdmitted)]
    assert [(e.job_id, e.gpu_uuids[0] in ("GPU-0", "GPU-1")) for e in admitted] == [
        (first.job_id, True)
    ]

    rig.clock.advance((STALE_AFTER + 1) * INTERVAL)  # both silent: stale
    second = await rig.submit(gpus=1)
    later = await rig.ticks(2)
    assert not [e for e in later if isinstance(e, JobAdmitted)]
    assert rig.dispatcher.records[first.job_id].state.value == "running"  # it keeps its GPU

    rig.report("GPU-0", "GPU-1")  # they report again
    back = [e for e in await rig.ticks(1) if isinstance(e, JobAdmitted)]
    assert [e.job_id for e in back] == [second.job_id]


# ---------------------------------------------------------------------------- the API


@pytest.fixture
def api(tmp_path) -> Iterator[Api]:
    rig = InventoryRig(tmp_path)
    instance = Api(rig)
    try:
        yield instance
    finally:
        instance.close()


def test_every_token_reads_the_inventory_with_status_and_pool_filter(api: Api) -> None:
    rig: InventoryRig = api.rig  # type: ignore[assignment]
    rig.inventory.on_record(
        encode_record(a100("GPU-old", "node-09", seen=T0_US - 3600 * SECOND_US))
    )
    rig.report("GPU-0")
    rig.inventory.on_record(encode_record(a_record("GPU-h", pool="h100", last_seen_us=T0_US)))
    status, body = api.call("GET", "/v1/inventory", VISION)
    assert status == 200
    assert [(g["uuid"], g["status"], g["placeable"]) for g in body["gpus"]] == [
        ("GPU-0", "live", True),
        ("GPU-h", "live", True),
        ("GPU-old", "stale", False),
    ]
    assert [(n["node"], n["gpus"], n["live"], n["stale"]) for n in body["nodes"]] == [
        ("node-01", 2, 2, 0),
        ("node-09", 1, 0, 1),
    ]
    assert body["nodes"][0]["pools"] == ["a100", "h100"] and body["nodes"][0]["cuda_version"]
    status, body = api.call("GET", "/v1/inventory?pool=h100", ADMIN)
    assert status == 200 and [g["uuid"] for g in body["gpus"]] == ["GPU-h"]
    assert body["gpus"][0]["labels"] == {"rack": "r1"} and body["gpus"][0]["health"] == "healthy"
    assert api.call("GET", "/v1/inventory")[0] == 401
    assert api.call("GET", "/v1/inventory?pool=h100&x=1", VISION)[0] == 400
