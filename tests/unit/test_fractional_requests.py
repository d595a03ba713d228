"""Fractional requests outside the cycle: how `--mig` and `--gpu-share` are read, the job spec
that carries them (written only when set), share packing as a pure function, the devices a MIG
job's processes see under the real local executor, and Slurm's MIG gres."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from ledger.errors import EventError
from ledger.fractional import parse_mig, parse_share, share_text, split_mig_model
from ledger.inventory import InventoryGpu, encode_record
from ledger.job_events import JobAdmitted, JobSubmitted, decode_job_event, encode_job_event
from scheduler.executors.errors import InvalidWork
from scheduler.executors.launch import visible_devices
from scheduler.executors.local import LocalExecutor
from scheduler.executors.slurm import SlurmExecutor
from scheduler.executors.slurm_text import gres_args, sbatch_argv
from scheduler.fractional import mig_devices, pack_share
from scheduler.inventory import FleetInventory
from scheduler.model import Flavor, GpuRef, RunningJob
from scheduler.ports import RunState
from scheduler.service import SchedulerService
from tally.components import desired_admin_state
from tally.config import ConfigError, parse_config
from tally.scheduling import build_dispatcher, teams_of
from tests.inventory_builders import a_mig_slice, a_record
from tests.scheduler_builders import a_spec
from tests.unit.test_local_executor import sh, until_ended
from tests.unit.test_scheduler_api_support import VISION, Api, a_job
from tests.unit.test_scheduler_service_support import Rig, config_data

T0 = 1_793_491_200_000_000


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("1g.10gb:2", ("1g.10gb", 2), id="profile-and-count"),
        pytest.param("3g.40gb", ("3g.40gb", 1), id="count-defaults-to-one"),
        pytest.param("1g.10gb+me:1", ("1g.10gb+me", 1), id="media-extension-profile"),
        pytest.param(" 2G.20GB:3 ", ("2g.20gb", 3), id="case-and-spaces"),
    ],
)
def test_a_mig_request_is_read(text: str, expected: tuple[str, int]) -> None:
    assert parse_mig(text) == expected


@pytest.mark.parametrize(
    "text", ["", "1g:2", "1g.10gb:0", "1g.10gb:x", "1g.10gb:65", "a100", "1g.10gb:1.5"]
)
def test_an_unreadable_mig_request_is_refused(text: str) -> None:
    with pytest.raises(EventError):
        parse_mig(text)


@pytest.mark.parametrize(
    ("text", "units"),
    [
        pytest.param("0.25", 250, id="quarter"),
        pytest.param("25%", 250, id="percent"),
        pytest.param("0.001", 1, id="smallest"),
        pytest.param("0.999", 999, id="largest"),
        pytest.param(".5", 500, id="no-leading-zero"),
    ],
)
def test_a_share_is_read_exactly_in_per_mille(text: str, units: int) -> None:
    assert parse_share(text) == units
    assert parse_share(share_text(units)) == units


@pytest.mark.parametrize("text", ["0", "1", "1.5", "0.0005", "-0.25", "nan", "inf", "x", "1e-4"])
def test_a_share_that_is_not_a_whole_per_mille_in_0_1_is_refused(text: str) -> None:
    with pytest.raises(EventError):
        parse_share(text)


def test_split_mig_model() -> None:
    assert split_mig_model("A100-SXM4-80GB/1g.10gb") == ("A100-SXM4-80GB", "1g.10gb")
    assert split_mig_model("A100") == ("A100", None)
    assert split_mig_model("vendor/odd-name") == ("vendor/odd-name", None)


# ---------------------------------------------------------------------------- the spec


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param({"gpus": 2, "mig_profile": "1g.10gb"}, id="mig"),
        pytest.param({"queue": "dev", "gpu_share": 250}, id="share"),
    ],
)
def test_a_fractional_spec_is_written_and_read_back(fields: dict[str, object]) -> None:
    event = JobSubmitted(spec=a_spec(**fields), time_us=T0)
    value = encode_job_event(event, "test")
    spec = orjson.loads(value)["data"]["spec"]
    assert {k: spec[k] for k in fields} == fields
    assert decode_job_event(value).data == event


def test_a_whole_gpu_spec_is_written_without_the_fractional_fields() -> None:
    spec = orjson.loads(encode_job_event(JobSubmitted(a_spec(), T0), "test"))["data"]["spec"]
    assert "mig_profile" not in spec and "gpu_share" not in spec


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param({"mig_profile": "1g.10gb", "gpu_share": 250}, id="both"),
        pytest.param({"mig_profile": "big"}, id="bad-profile"),
        pytest.param({"gpu_share": 1000}, id="share-of-a-whole-gpu"),
        pytest.param({"gpu_share": 0}, id="share-of-nothing"),
        pytest.param({"gpu_share": 250, "gpus": 2}, id="share-of-two-gpus"),
    ],
)
def test_an_inconsistent_fractional_spec_cannot_be_built(fields: dict[str, object]) -> None:
    with pytest.raises(EventError):
        a_spec(**fields)


def test_a_float_share_on_the_wire_is_refused() -> None:
    value = encode_job_event(JobSubmitted(a_spec(gpu_share=250), T0), "test")
    with pytest.raises(EventError, match="gpu_share"):
        decode_job_event(value.replace(b'"gpu_share":250', b'"gpu_share":0.25'))


# ---------------------------------------------------------------------------- packing


PACK_CASES = {
    "first-share-takes-the-first-free-gpu": (250, {}, ("G1", "G2"), set(), "G1"),
    "joins-a-shared-gpu-before-opening-a-free-one": (250, {"G2": 500}, ("G1",), set(), "G2"),
    "best-fit-the-fullest-gpu-with-room": (250, {"G1": 250, "G2": 750}, (), set(), "G2"),
    "exactly-one-whole-gpu": (250, {"G1": 750}, (), set(), "G1"),
    "never-past-one-gpu": (300, {"G1": 750}, ("G3",), set(), "G3"),
    "never-on-a-whole-held-gpu": (250, {"G1": 250}, ("G2",), {"G1"}, "G2"),
    "no-room-anywhere": (600, {"G1": 500}, (), set(), None),
}


@pytest.mark.parametrize("case", PACK_CASES.values(), ids=PACK_CASES.keys())
def test_pack_share(case: tuple) -> None:
    share, loads, free, held, expected = case
    assert pack_share(share, loads, free, frozenset(held)) == expected


# ---------------------------------------------------------------------------- executors


def carved_gpu() -> InventoryGpu:
    return a_record(
        "GPU-5e1c",
        model="A100",
        mig_mode=True,
        mig=(a_mig_slice(1, "3g.40gb", 3), a_mig_slice(2, "3g.40gb", 3)),
    )


def mig_job(*instances: int) -> RunningJob:
    return RunningJob(
        spec=a_spec(gpus=len(instances), mig_profile="3g.40gb"),
        flavor=Flavor("a100", "A100/3g.40gb"),
        gpus=tuple(GpuRef(f"GPU-5e1c/gi{i}", "node-01/A100/3g.40gb") for i in instances),
        priority=0,
        preemptible=True,
        admitted_us=0,
        attempt=1,
    )


def test_the_local_executor_pins_a_mig_job_to_its_mig_devices(tmp_path: Path) -> None:
    ex = LocalExecutor(tmp_path, device_ids=mig_devices(carved_gpu()))
    script = 'echo "$CUDA_VISIBLE_DEVICES|$NVIDIA_VISIBLE_DEVICES"'
    ex.start(mig_job(2, 1), sh(script))
    until_ended(ex, "job-1")
    expected = "MIG-GPU-5e1c/2/0,MIG-GPU-5e1c/1/0"
    assert ex.log_path("job-1").read_text() == f"{expected}|{expected}\n"


def test_devices_of_a_share_are_its_gpus() -> None:
    job = RunningJob(
        spec=a_spec(queue="dev", gpu_share=250),
        flavor=Flavor("a100", "A100"),
        gpus=(GpuRef("GPU-7/share/job-1", "node-02"),),
        priority=0,
        preemptible=True,
        admitted_us=0,
        attempt=1,
    )
    assert visible_devices(job, {"GPU-7": "3"}) == ("3",)
    assert visible_devices(job, {}) == ("GPU-7",)


@pytest.mark.parametrize(
    ("instances", "pin", "expected"),
    [
        pytest.param((1, 2), False, ["--nodes=1", "--gres=gpu:3g.40gb:2"], id="mig-gres"),
        pytest.param(
            (1,), True, ["--nodes=1", "--gres=gpu:3g.40gb:1", "--nodelist=node-01"], id="pinned"
        ),
    ],
)
def test_sbatch_asks_for_mig_instances_by_profile(
    instances: tuple[int, ...], pin: bool, expected: list[str]
) -> None:
    assert gres_args(mig_job(*instances), pin) == expected


def share_job(share: int, node: str = "node-02") -> RunningJob:
    return RunningJob(
        spec=a_spec(queue="dev", gpu_share=share),
        flavor=Flavor("a100", "A100"),
        gpus=(GpuRef("GPU-7/share/job-1", node),),
        priority=0,
        preemptible=True,
        admitted_us=0,
        attempt=1,
    )


@pytest.mark.parametrize(
    ("share", "shards", "pin", "expected"),
    [
        pytest.param(250, 8, False, ["--nodes=1", "--gres=shard:2"], id="quarter-of-8"),
        pytest.param(300, 8, False, ["--nodes=1", "--gres=shard:3"], id="rounds-up"),
        pytest.param(1, 8, False, ["--nodes=1", "--gres=shard:1"], id="at-least-one"),
        pytest.param(999, 8, False, ["--nodes=1", "--gres=shard:8"], id="nearly-whole"),
        pytest.param(125, 1000, False, ["--nodes=1", "--gres=shard:125"], id="per-mille-shards"),
        pytest.param(
            500, 100, True, ["--nodes=1", "--gres=shard:50", "--nodelist=node-02"], id="pinned"
        ),
    ],
)
def test_sbatch_asks_for_a_share_as_slurm_shards(
    share: int, shards: int, pin: bool, expected: list[str]
) -> None:
    assert gres_args(share_job(share, "node-02/A100" if pin else "node-02"), pin, shards) == (
        expected
    )


def test_sbatch_argv_of_a_share_and_a_share_without_shards_configured(tmp_path: Path) -> None:
    argv = sbatch_argv(
        share_job(250), sh("true"), log_path="l", time_limit_us=None, shards_per_gpu=4
    )
    assert "--gres=shard:1" in argv and not any(a.startswith("--gres=gpu") for a in argv)
    with pytest.raises(InvalidWork, match="shards per GPU"):
        gres_args(share_job(250), False, None)
    calls: list[list[str]] = []
    ex = SlurmExecutor(tmp_path, runner=lambda argv, **_: calls.append(argv))  # type: ignore
    ex.start(share_job(250), sh("true"))
    (failed,) = ex.poll()
    assert failed.state is RunState.FAILED and "shards_per_gpu" in failed.detail
    assert calls == []  # never submitted


# ---------------------------------------------------------------------------- the API


def test_fractional_requests_through_the_real_api(tmp_path: Path) -> None:
    """A `1g.10gb` quota from the config, a carved A100 from the inventory: a MIG job submitted
    over HTTP runs on two instances; a share is taken by a dev queue only, as an exact
    decimal."""
    data = config_data(tmp_path)
    data["quotas"].append(
        {"team": "vision", "pool": "a100", "model": "A100", "mig_profile": "1g.10gb", "nominal": 2}
    )
    rig = Rig(tmp_path, data)
    rig.inventory = FleetInventory(6)
    rig.dispatcher = build_dispatcher(rig.config, rig.executor, rig.clock, inventory=rig.inventory)
    rig.service = SchedulerService(rig.dispatcher, rig.publisher, inventory=rig.inventory)
    carved = a_record(
        "GPU-M",
        pool="a100",
        model="A100",
        mig_mode=True,
        mig=(a_mig_slice(13, "1g.10gb", 1), a_mig_slice(14, "1g.10gb", 1)),
        last_seen_us=rig.clock.now_us(),
    )
    rig.inventory.on_record(encode_record(carved))
    rig.inventory.on_record(
        encode_record(a_record("GPU-W", pool="a100", model="A100", last_seen_us=T0))
    )
    api = Api(rig)
    try:
        job = api.submit(VISION, queue="train", gpus=2, mig_profile="1g.10gb")
        api.tick()
        api.tick()
        status, body = api.call("GET", f"/v1/jobs/{job}", VISION)
        view = body["job"]
        assert status == 200 and view["mig_profile"] == "1g.10gb" and view["gpu_share"] is None
        assert view["state"] == "running", view["detail"]
        admitted = [e for e in rig.events() if isinstance(e, JobAdmitted)]
        assert admitted[0].gpu_uuids == ("GPU-M/gi13", "GPU-M/gi14")

        shared = api.submit(VISION, queue="dev", gpu_share="25%")
        status, body = api.call("GET", f"/v1/jobs/{shared}", VISION)
        assert body["job"]["gpu_share"] == "0.25"
        status, body = api.call(
            "POST", "/v1/jobs", VISION, json=a_job(gpu_share="0.25", queue="train")
        )
        assert status == 422 and "dev and inference" in body["error"]["message"]
        status, body = api.call("POST", "/v1/jobs", VISION, json=a_job(gpu_share="0.0001"))
        assert status == 400 and "gpu_share" in body["error"]["message"]
        status, body = api.call("POST", "/v1/jobs", VISION, json=a_job(gpu_share=0.25))
        assert status == 400  # a JSON number is no exact decimal: refused
    finally:
        api.close()


# ---------------------------------------------------------------------------- quotas in config


def quota_config(tmp_path: Path, *extra: dict[str, object]):
    data = config_data(tmp_path)
    data["quotas"].extend(extra)
    return parse_config(data, "test.yaml")


MIG_QUOTA = {"team": "vision", "pool": "a100", "model": "A100", "mig_profile": "1g.10gb"}


def test_a_quota_per_mig_profile_reaches_the_scheduler_and_the_admin_events(tmp_path) -> None:
    config = quota_config(tmp_path, {**MIG_QUOTA, "nominal": 4, "borrowing_limit": 1})
    (vision,) = [t for t in teams_of(config) if t.name == "vision"]
    quotas = {q.flavor.model: (q.nominal, q.borrowing_limit) for q in vision.quotas}
    assert quotas == {"A100": (2, None), "A100/1g.10gb": (4, 1)}
    applied = {(q.team, q.model, q.nominal_gpus) for q in desired_admin_state(config).quotas}
    assert ("vision", "A100/1g.10gb", 4) in applied and ("vision", "A100", 2) in applied


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param(({**MIG_QUOTA, "mig_profile": "big", "nominal": 1},), id="bad-profile"),
        pytest.param(({**MIG_QUOTA, "nominal": 1}, {**MIG_QUOTA, "nominal": 2}), id="twice"),
        pytest.param(
            ({"team": "vision", "pool": "a100", "model": "A100/1g.10gb", "nominal": 1},),
            id="profile-in-the-model",
        ),
    ],
)
def test_a_bad_mig_quota_is_refused(tmp_path, extra: tuple[dict[str, object], ...]) -> None:
    with pytest.raises(ConfigError):
        quota_config(tmp_path, *extra)
