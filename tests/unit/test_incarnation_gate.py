"""The broker-incarnation check of a batch (`streams.incarnation_gate`): asked beside the fold,
its answer awaited by the batch's commits, and a refused batch commits nothing — also a sharded
worker's, samples or the view feed's admin/jobs/inventory, asked once for all its shards."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import pytest

from ledger.holds import encode_hold, hold_envelope
from ledger.ingest import ConsumedMessage
from ledger.store.memory import MemoryStore
from ledger.store.objects import LocalObjectStore
from streams.incarnation_gate import IncarnationChanged, IncarnationGate, refuses
from streams.shards import GLOBAL, open_shard, samples_shard
from tests.unit.test_balances import ingestor, samples
from tests.unit.test_shard_wiring import INC, PLACED, Broker, a_worker
from tests.unit.test_store import TOPIC, message

APPLIED = "cluster-a"


@pytest.mark.parametrize(
    ("current", "refused"),
    [
        pytest.param(APPLIED, False, id="same-broker"),
        pytest.param("cluster-b", True, id="another-broker"),
        pytest.param(None, False, id="broker-not-reached-keeps-what-was-known"),
    ],
)
def test_which_answers_refuse_a_batch(current, refused):
    assert refuses(APPLIED, current) is refused


def outcome(confirm: Callable[[], None]) -> str:
    try:
        confirm()
    except Exception as exc:
        return type(exc).__name__
    return "committed"


@pytest.mark.parametrize(
    ("answer", "commit", "verdict"),
    [
        pytest.param(APPLIED, "committed", None, id="same-broker"),
        pytest.param("cluster-b", "IncarnationChanged", "cluster-b", id="another-broker"),
        pytest.param(None, "committed", None, id="broker-not-reached"),
    ],
)
def test_the_commit_waits_for_the_brokers_answer(answer, commit, verdict):
    async def scenario() -> tuple[str, IncarnationChanged | None]:
        asked: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        gate = IncarnationGate(APPLIED, asked)
        confirming = asyncio.create_task(asyncio.to_thread(outcome, gate.confirm))
        await asyncio.sleep(0.05)
        assert not confirming.done()  # the fold is done, the broker has not answered yet
        asked.set_result(answer)
        return await confirming, await gate.verdict()

    committed, refused = asyncio.run(scenario())
    assert committed == commit
    assert (refused.current if refused else None) == verdict


def test_a_failed_question_refuses_the_commit_and_raises_on_the_loop():
    async def scenario() -> str:
        asked: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        gate = IncarnationGate(APPLIED, asked)
        asked.set_exception(ValueError("no answer"))
        committed = await asyncio.to_thread(outcome, gate.confirm)
        with pytest.raises(ValueError, match="no answer"):
            await gate.verdict()
        return committed

    assert asyncio.run(scenario()) == "RuntimeError"


def test_a_refused_batch_commits_nothing_and_is_applied_once_confirmed():
    def refuse() -> None:
        raise IncarnationChanged("cluster-b", "c")

    store = MemoryStore()  # where `confirm` is called is the ingest's, whatever the store
    ing = ingestor(store)
    batch = [samples(0, 1, 3)]
    with pytest.raises(IncarnationChanged):
        ing.apply(batch, refuse)
    assert store.applied_offsets("c") == {}
    assert store.balance_rows() == []
    assert ing.next_offset("samples", 0) == 0
    confirmed: list[bool] = []
    result = ing.apply(batch, lambda: confirmed.append(True))
    assert (result.samples, confirmed) == (3, [True])
    assert store.applied_offsets("c") == {("samples", 0): 1}


def test_a_batch_abandoned_before_the_answer_leaves_no_commit_waiting():
    async def scenario() -> str:
        asked: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        gate = IncarnationGate(APPLIED, asked)
        confirming = asyncio.create_task(asyncio.to_thread(outcome, gate.confirm))
        await asyncio.sleep(0.05)
        gate.close()  # the worker's call was cancelled: the broker never answers
        return await asyncio.wait_for(confirming, 5)

    assert asyncio.run(scenario()) == "RuntimeError"


class Exited(Exception):
    """What the worker's exit (75) is in process: the refusal's broker."""


@pytest.mark.parametrize(
    ("batch", "answer", "applied_before", "exited", "applied"),
    [
        pytest.param("samples", INC, False, None, {"samples-0": 1}, id="samples-same-broker"),
        pytest.param("samples", "cluster-b", False, "cluster-b", {}, id="samples-another-broker"),
        pytest.param(
            "views", INC, False, None, {"global": 1, "samples-0": 1}, id="views-same-broker"
        ),
        pytest.param("views", "cluster-b", False, "cluster-b", {}, id="views-another-broker"),
        pytest.param(
            "views",
            "cluster-b",
            True,
            "cluster-b",
            {"global": 1, "samples-0": 1},
            id="views-applied-before-another-broker-still-exits",
        ),
    ],
)
def test_a_sharded_workers_batch_from_another_broker_commits_nothing_and_exits(
    tmp_path, batch, answer, applied_before, exited, applied
):
    """Samples go to their partition's shard, a jobs event from the view feed to both shards
    held: either batch is asked about once, and refused commits nothing in any shard."""
    broker = Broker(answer)
    worker = a_worker(tmp_path / "a", LocalObjectStore(tmp_path / "objects"), broker)
    exits: list[str] = []

    def exit_75(refused: IncarnationChanged) -> None:
        exits.append(refused.current)
        raise Exited(refused.current)

    worker._incarnation_changed = exit_75
    for spec in (GLOBAL, samples_shard(0)):
        worker.shards[spec.name] = open_shard(worker.shard_settings, spec, INC)
    if batch == "samples":
        topic, messages = TOPIC, [message(0, 1, partition=0)]
        hand = worker._apply(messages)
    else:
        topic = "jobs"
        messages = [ConsumedMessage(topic, 0, 0, encode_hold(hold_envelope(PLACED))[1])]
        if applied_before:
            for shard in worker.shards.values():
                shard.ingestor.apply(messages)
        hand = worker._hand_views(messages, dict(worker.shards))
    with contextlib.suppress(Exited):  # the refused batch's exit
        asyncio.run(hand)
    offsets = {n: s.ingestor.next_offset(topic, 0) for n, s in worker.shards.items()}
    for shard in worker.shards.values():
        shard.store.close()  # not sealed: nothing to hand over
    assert {n: o for n, o in offsets.items() if o} == applied
    assert (exits, broker.asked) == ([exited] if exited else [], 1)  # once for both shards
