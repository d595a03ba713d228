"""Admin price changes reach the scheduler through the real broker: a `PriceSet` on the `admin`
topic (tansu) is read by the service's feeds and the next placement uses it; so does a
`QuotaSet` (`tally admin apply`'s, or an approved request's): the scheduler admits against it.
A request step the scheduler's request desk publishes there (`KafkaPublisher.publish_admin`)
is read back by the feeds into another desk."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from aiokafka import AIOKafkaProducer

from ledger.admin.codec import admin_envelope, encode_admin
from ledger.admin.events import PriceSet, QuotaSet
from ledger.admin.requests import ApprovalPolicy
from scheduler.kafka import Feeds, KafkaPublisher
from scheduler.model import Flavor
from scheduler.requests import RequestDesk
from scheduler.service import ServiceSettings
from tests.conftest import create_topics
from tests.unit.test_requests import BUDGET
from tests.unit.test_scheduler_service_price import two_model_config
from tests.unit.test_scheduler_service_support import T0_US, Rig


def _settings(bootstrap: str, tmp: Path) -> ServiceSettings:
    return ServiceSettings(
        bootstrap=(bootstrap,),
        jobs_topic="jobs",
        balances_topic="balances",
        alerts_topic="alerts",
        admin_topic="admin",
        ledger_group="ledger",
        work_dir=tmp,
    )


def test_an_admin_price_cut_makes_the_premium_model_the_cheapest(broker, tmp_path):
    create_topics(broker.bootstrap, ["jobs", "balances", "alerts", "admin"], partitions=2)
    rig = Rig(tmp_path, two_model_config(tmp_path))
    cut = PriceSet("H100", None, 1_000_000, "admin", "spot contract", T0_US - 1)
    key, value = encode_admin(admin_envelope(cut))
    more = QuotaSet("language", "a100", "A100", 6, 2, None, "admin", "approved", T0_US - 1)
    quota_key, quota_value = encode_admin(admin_envelope(more))
    language = ("language", Flavor("a100", "A100"))
    assert rig.dispatcher.state.quotas.quota[language].nominal == 2  # the configuration's

    async def go() -> str:
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap)
        await producer.start()
        try:
            await producer.send_and_wait("admin", value, key=key)
            await producer.send_and_wait("admin", quota_value, key=quota_key)
        finally:
            await producer.stop()
        settings = _settings(broker.bootstrap, tmp_path)
        publisher = KafkaPublisher(settings)
        await publisher.start()
        try:
            await RequestDesk(ApprovalPolicy(), publisher).send(BUDGET)
        finally:
            await publisher.stop()
        reader = RequestDesk(ApprovalPolicy(), publisher)
        feeds = Feeds(settings, rig.dispatcher, requests=reader)
        await feeds.start()
        try:
            deadline = time.monotonic() + 20
            while (
                rig.dispatcher.state.prices is feeds.prices.default
                or not reader.states
                or rig.dispatcher.state.quotas.quota[language].nominal != 6
            ):
                assert time.monotonic() < deadline, "the price, quota or request never arrived"
                await feeds.poll(timeout_ms=200)
            applied = rig.dispatcher.state.quotas.quota[language]
            assert (applied.borrowing_limit, applied.lending_limit) == (2, None)
        finally:
            await feeds.stop()
        assert list(reader.states) == [BUDGET.request_id]
        record = await rig.submit(queue="train", gpus=2, models=("A100", "H100"))
        await rig.ticks(1)
        return record.job_id

    job = asyncio.run(go())
    record = rig.dispatcher.records[job]
    assert record.model == "H100"
    assert "placed on H100: cheapest acceptable at 1.00/GPU-h; A100 1.80/GPU-h not needed" in (
        record.placement
    )
