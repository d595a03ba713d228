"""Price-aware placement through the service: the dispatcher on the fake executor, built from a
config with two priced GPU models and a queue that forbids the premium one. Submissions that
accept several models land on the cheapest that admits them, the hold is priced at the model
placed on, a queue's policy is enforced at submit and in every cycle, and `explain` and the
job's record say why."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import Any

import orjson
import pytest

from ledger.holds import HoldPlaced
from ledger.job_events import JobAdmitted, JobSubmitted, JobWaiting, WaitReason
from ledger.pricing import cost_of
from ledger.units import Unit
from scheduler.api.views import queue_views
from scheduler.errors import Rejected, RejectKind
from scheduler.idempotency import request_digest
from scheduler.ports import Work
from scheduler.records import JobState, SubmitRequest
from tally.config import parse_config
from tests.unit.test_scheduler_service_support import HOUR_US, Rig, budget_update, config_data


def two_model_config(tmp: Path) -> dict[str, Any]:
    """The support config with an H100 and an A100 pool (3.20 and 1.80 per GPU-hour) and a dev
    queue that forbids H100."""
    data = config_data(tmp)
    data["fleet"]["pools"] = [
        {"name": "h100", "model": "H100", "nodes": 1, "gpus_per_node": 4},
        {"name": "a100", "model": "A100", "nodes": 1, "gpus_per_node": 4},
    ]
    data["prices"] = [
        {"model": "A100", "per_gpu_hour": "1.80"},
        {"model": "H100", "per_gpu_hour": "3.20"},
    ]
    data["quotas"] = [  # H100 first: quota order alone would pick the premium model
        {"team": "vision", "pool": "h100", "model": "H100", "nominal": 4},
        {"team": "vision", "pool": "a100", "model": "A100", "nominal": 4},
        {"team": "language", "pool": "a100", "model": "A100", "nominal": 2},
    ]
    data["queues"][0]["forbidden_models"] = ["H100"]  # dev never on H100
    return data


def test_jobs_land_on_the_cheapest_acceptable_model_and_say_why(tmp_path):
    rig = Rig(tmp_path, two_model_config(tmp_path))
    rig.dispatcher.on_balance(budget_update("vision", 1, money_granted=1_000_000_000))
    either = ("A100", "H100")

    async def go() -> tuple[str, str, str]:
        first = await rig.submit(queue="train", gpus=4, models=either, estimated_runtime_us=HOUR_US)
        await rig.ticks(1)
        second = await rig.submit(queue="train", gpus=2, models=either)
        dev = await rig.submit(queue="dev", gpus=1, models=either)
        await rig.ticks(1)
        return first.job_id, second.job_id, dev.job_id

    first, second, dev = asyncio.run(go())
    records = rig.dispatcher.records
    assert (records[first].pool, records[first].model) == ("a100", "A100")
    assert "placed on A100: cheapest acceptable at 1.80/GPU-h; H100 3.20/GPU-h not needed" in (
        records[first].placement
    )
    held = {
        e.unit: e.amount for e in rig.events() if isinstance(e, HoldPlaced) and e.job_id == first
    }
    assert held[Unit.MONEY] == cost_of(4 * HOUR_US // 1000, 1_800_000)  # at the placed model
    assert records[second].model == "H100"
    assert "A100 full, H100 chosen at 3.20/GPU-h" in records[second].placement
    # dev may not use the free H100s: it waits for an A100 and says why
    assert records[dev].state is JobState.PENDING
    (wait,) = [e for e in rig.events() if isinstance(e, JobWaiting) and e.job_id == dev]
    assert wait.reason is WaitReason.NO_CAPACITY
    assert "queue dev does not allow model(s) H100" in wait.detail
    (submitted,) = [e for e in rig.events() if isinstance(e, JobSubmitted) and e.job_id == dev]
    assert submitted.spec.accepted_models == either
    text = rig.dispatcher.explain(second)
    assert "2 GPU(s) of A100|H100" in text and "A100 full, H100 chosen" in text
    admitted = [e for e in rig.events() if isinstance(e, JobAdmitted)]
    assert {e.job_id: e.model for e in admitted} == {first: "A100", second: "H100"}


def test_a_queue_policy_that_leaves_no_requested_model_refuses_the_submission(tmp_path):
    rig = Rig(tmp_path, two_model_config(tmp_path))
    with pytest.raises(Rejected) as refused:
        asyncio.run(rig.submit(queue="dev", models=("H100",)))
    assert refused.value.kind is RejectKind.UNKNOWN  # a 422 from the API
    assert "queue dev does not allow model(s) H100" in str(refused.value)
    assert not rig.events()


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        pytest.param({"forbidden_models": ["V100"]}, "unknown GPU model(s) V100", id="unknown"),
        pytest.param(
            {"allowed_models": ["A100"], "forbidden_models": ["A100"]},
            "allows no model",
            id="allows-nothing",
        ),
        pytest.param({"allowed_models": []}, "allowed_models", id="empty-allowed-list"),
    ],
)
def test_a_queue_model_policy_is_validated_against_the_configured_models(
    tmp_path, policy: dict[str, Any], message: str
):
    data = two_model_config(tmp_path)
    data["queues"][1].update(policy)
    with pytest.raises(Exception, match=r"(?s)" + message.replace("(", r"\(").replace(")", r"\)")):
        parse_config(data, "test.yaml")


def _old_digest(request: SubmitRequest, model: str | None) -> str:
    """The digest as computed when a request named one `model` (the dataclass's fields in
    order, the key left out)."""
    data = {
        "team": request.team,
        "project": request.project,
        "user": request.user,
        "queue": request.queue,
        "gpus": request.gpus,
        "work": request.work,
        "estimated_runtime_us": request.estimated_runtime_us,
        "max_runtime_us": request.max_runtime_us,
        "model": model,
        "pool": request.pool,
        "span_nodes": request.span_nodes,
        "priority": request.priority,
        "admin": request.admin,
        "idempotency_key": None,
    }
    return hashlib.blake2b(orjson.dumps(data), digest_size=16).hexdigest()


@pytest.mark.parametrize(
    "models", [pytest.param((), id="any-model"), pytest.param(("A100",), id="one-model")]
)
def test_keys_of_single_model_requests_keep_their_digest(models: tuple[str, ...]):
    request = SubmitRequest("vision", "detection", "ada", "train", 2, Work(command=("true",)),
                            models=models, idempotency_key="k")  # fmt: skip
    assert request_digest(request) == _old_digest(request, models[0] if models else None)


def test_the_digest_of_several_models_ignores_their_order():
    def digest(models: tuple[str, ...]) -> str:
        return request_digest(SubmitRequest("v", "p", "u", "q", 1, Work(command=("true",)),
                                            models=models))  # fmt: skip

    assert digest(("H100", "A100")) == digest(("A100", "H100")) != digest(("A100",))


def test_queues_show_their_model_policy(tmp_path):
    views = {v.name: v for v in queue_views(Rig(tmp_path, two_model_config(tmp_path)).dispatcher)}
    assert (views["dev"].allowed_models, views["dev"].forbidden_models) == (None, ["H100"])
    assert (views["train"].allowed_models, views["train"].forbidden_models) == (None, [])
