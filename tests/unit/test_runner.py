"""The real-time collection loop (`run_rounds`) with a fake clock, the producer with no broker to
talk to, and the collector's `/metrics` endpoint."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import replace
from types import SimpleNamespace

import orjson
import pytest
from aiokafka.errors import (
    CorruptRecordException,
    KafkaConnectionError,
    MessageSizeTooLargeError,
    UnknownError,
)

import collectors.producer as producer_module
from collectors.errors import ProducerError
from collectors.metrics import CollectorMetrics, ErrorKind
from collectors.nvml import RoundResult
from collectors.producer import SampleProducer
from collectors.runner import run_rounds
from collectors.spool import Spool
from ledger.events import Envelope, GpuHealth, HealthKind, SampleSource, envelope_for
from tally.broker import free_port
from tests.builders import T0_US, a_sample

INTERVAL_S = 10.0
INTERVAL_US = 10_000_000
GPUS = ("GPU-a", "GPU-b")


class FakeClock:
    """Time moves only when the loop sleeps or a read takes time."""

    def __init__(self, now_us: int) -> None:
        self.now_us = now_us
        self.slept_s = 0.0

    def __call__(self) -> int:
        return self.now_us

    async def sleep(self, seconds: float) -> None:
        self.slept_s += seconds
        self.now_us += max(1, round(seconds * 1e6))
        await asyncio.sleep(0)


class FakeSink:
    def __init__(self) -> None:
        self.metrics = CollectorMetrics()
        self.buffered: list[Envelope] = []
        self.flushed: list[list[Envelope]] = []

    def add(self, envelopes: Iterable[Envelope]) -> None:
        self.buffered.extend(envelopes)

    async def flush(self) -> int:
        self.flushed.append(self.buffered)
        self.buffered = []
        return len(self.flushed[-1])


class Reader:
    """Reads rounds at the fake clock's time; each read takes `took_us` of it."""

    def __init__(self, clock: FakeClock, stop_after: int, fail_on: set[int], took_us=None):
        self.clock = clock
        self.stop_after = stop_after
        self.fail_on = fail_on
        self.took_us = took_us or {}
        self.calls: list[int] = []
        self.stop: asyncio.Event | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    def __call__(self) -> RoundResult:
        now = self.clock()
        self.calls.append(now)
        self.clock.now_us += self.took_us.get(len(self.calls), INTERVAL_US)
        if len(self.calls) >= self.stop_after:
            assert self.loop is not None and self.stop is not None
            self.loop.call_soon_threadsafe(self.stop.set)
        if len(self.calls) in self.fail_on:
            raise RuntimeError("NVML went away for a moment")
        samples = tuple(
            a_sample(gpu_uuid=uuid, source=SampleSource.NVML, sample_time_us=now) for uuid in GPUS
        )
        health: tuple[GpuHealth, ...] = ()
        if len(self.calls) == 1:
            health = (
                GpuHealth(
                    "node-01",
                    "GPU-b",
                    1,
                    HealthKind.XID_ERROR,
                    "xid 79",
                    now,
                    SampleSource.NVML,
                    xid=79,
                ),
            )
        return RoundResult(samples, health, ())


def run(reader: Reader, sink: FakeSink, **kwargs) -> int:
    async def main() -> int:
        reader.stop = asyncio.Event()
        reader.loop = asyncio.get_running_loop()
        return await asyncio.wait_for(
            run_rounds(
                reader,
                sink,
                INTERVAL_S,
                reader.stop,
                reader.clock,
                sleep=reader.clock.sleep,
                **kwargs,
            ),
            10,
        )

    return asyncio.run(main())


def test_rounds_follow_the_grid_and_a_failed_read_does_not_stop_the_loop():
    clock = FakeClock(T0_US - 1)
    reader = Reader(clock, stop_after=5, fail_on={2})
    sink = FakeSink()
    alerts: list[tuple[bytes, bytes]] = []
    rounds = run(reader, sink, health_topic_sender=lambda k, v: alerts.append((k, v)))

    assert rounds == 4
    assert reader.calls == [T0_US + i * INTERVAL_US for i in range(5)]
    assert [len(f) for f in sink.flushed] == [2, 2, 2, 2]
    envelopes = [e for f in sink.flushed for e in f]
    assert {e.source for e in envelopes} == {"nvml://node-01"}
    assert len({e.id for e in envelopes}) == 8
    m = sink.metrics
    assert m.value("errors_total", kind=ErrorKind.READ.value) == 1
    assert m.value("samples_read_total") == 8
    assert m.value("rounds_total") == 4
    ((key, value),) = alerts
    assert key == b"node-01"
    event = orjson.loads(value)
    assert (event["type"], event["data"]["xid"], event["source"]) == (
        "tally.gpu.health",
        79,
        "nvml://node-01",
    )


def test_a_slow_round_skips_the_rounds_it_missed_instead_of_bursting():
    clock = FakeClock(T0_US - 1)
    reader = Reader(clock, stop_after=3, fail_on=set(), took_us={1: 2 * INTERVAL_US + 5})
    run(reader, FakeSink())
    assert reader.calls == [T0_US, T0_US + 3 * INTERVAL_US, T0_US + 4 * INTERVAL_US]


def test_once_reads_one_round_now():
    clock = FakeClock(T0_US + 1234)
    reader = Reader(clock, stop_after=99, fail_on=set())
    sink = FakeSink()
    assert run(reader, sink, once=True) == 1
    assert reader.calls == [T0_US + 1234]
    assert len(sink.flushed) == 1


# ---------------------------------------------------------------------------- no broker


def _closed_port_bootstrap() -> str:
    return f"127.0.0.1:{free_port()}"


def test_without_a_spool_an_unreachable_broker_fails_at_start():
    producer = SampleProducer(_closed_port_bootstrap(), "samples", connect_timeout_s=5)
    with pytest.raises(ProducerError, match="cannot connect"):
        asyncio.run(producer.start())


def test_with_a_spool_an_unreachable_broker_means_spooling(tmp_path):
    spool = Spool(tmp_path / "spool")
    producer = SampleProducer(_closed_port_bootstrap(), "samples", spool=spool, connect_timeout_s=5)
    alerts = producer.topic_sender("alerts")
    samples = [
        a_sample(gpu_uuid=u, sample_time_us=T0_US + i * INTERVAL_US)
        for u in GPUS
        for i in range(1, 4)
    ]

    async def main() -> int:
        await producer.start()
        producer.add(replace(e, source="sim://node-01") for e in _envelopes(samples))
        alerts(b"GPU-a", b"{}")
        acked = await producer.flush()
        await producer.stop()
        return acked

    assert asyncio.run(main()) == 0
    m = producer.metrics
    assert m.value("broker_up") == 0
    assert m.value("samples_spooled_total") == len(samples)
    assert m.value("spool_records") == len(GPUS) + 1  # one message per GPU, one alert
    assert m.value("errors_total", kind=ErrorKind.CONNECT.value) >= 1
    assert producer.pending() == 0
    spool.close()
    with Spool(tmp_path / "spool") as reopened:
        topics = [r.topic for r in reopened.peek(10)]
        assert topics == ["samples", "samples", "alerts"]
        assert reopened.samples == len(samples)


def _envelopes(samples) -> list[Envelope]:
    return [envelope_for(s, "sim://node-01") for s in samples]


# ---------------------------------------------------------------------------- a fake broker


class FakeBroker:
    """What the fake aiokafka producers talk to: up or down, and what it received, in order."""

    def __init__(self) -> None:
        self.down = False
        self.refuses_idempotence = False
        self.largest = 1 << 30
        self.corrupt = False  # the broker answers every message with a corrupt-record error
        self.refuse_on_send = False  # the client refuses before sending (max_request_size)
        self.received: list[tuple[str, bytes, bytes]] = []
        self.starts: list[bool] = []


class FakeKafka:
    def __init__(self, broker: FakeBroker, idempotent: bool) -> None:
        self.broker = broker
        self.idempotent = idempotent
        self._sender = SimpleNamespace(sender_task=None)
        self.client = SimpleNamespace(close=self._noop)
        self._closed = False

    async def _noop(self) -> None:
        return None

    async def start(self) -> None:
        self.broker.starts.append(self.idempotent)
        if self.broker.down:
            raise KafkaConnectionError("connection refused")
        if self.idempotent and self.broker.refuses_idempotence:
            raise UnknownError()

    async def stop(self) -> None:
        self._closed = True

    async def send(self, topic: str, value: bytes, key: bytes | None = None) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        if self.broker.down:
            return future  # never acknowledged
        if self.broker.refuse_on_send:
            raise MessageSizeTooLargeError("larger than max_request_size")
        if len(value) > self.broker.largest:
            future.set_exception(MessageSizeTooLargeError())
            return future
        if self.broker.corrupt:
            future.set_exception(CorruptRecordException())
            return future
        self.broker.received.append((topic, key or b"", value))
        future.set_result(None)
        return future


@pytest.fixture
def fake_broker(monkeypatch) -> FakeBroker:
    broker = FakeBroker()
    monkeypatch.setattr(
        producer_module,
        "new_kafka_producer",
        lambda bootstrap, client_id, linger_ms, compression, idempotent, options=None: FakeKafka(
            broker, idempotent
        ),
    )
    return broker


def _round(i: int) -> list[Envelope]:
    return _envelopes([a_sample(gpu_uuid="GPU-a", sample_time_us=T0_US + i * INTERVAL_US)])


def _times(received: list[tuple[str, bytes, bytes]]) -> list[int]:
    return [e["time"] for _, _, value in received for e in orjson.loads(value)]


def test_spooled_samples_are_replayed_in_order_before_new_ones(fake_broker, tmp_path):
    spool = Spool(tmp_path / "spool")
    producer = SampleProducer(
        "fake:9092", "samples", spool=spool, send_timeout_s=0.05, min_backoff_s=0.0
    )

    async def main() -> list[int]:
        await producer.start()
        acked = []
        for i in range(1, 9):
            fake_broker.down = 3 <= i <= 5  # rounds 3, 4, 5 meet a broker that is away
            producer.add(_round(i))
            acked.append(await producer.flush())
            await asyncio.sleep(0.01)  # the time between rounds: a reconnect runs meanwhile
        assert producer.metrics.value("broker_up") == 1
        await producer.stop()
        assert producer.metrics.value("broker_up") == 0
        return acked

    acked = asyncio.run(main())
    assert _times(fake_broker.received) == [T0_US + i * INTERVAL_US for i in range(1, 9)]
    assert sum(acked) == 8
    m = producer.metrics
    assert (m.value("samples_sent_total"), m.value("samples_replayed_total")) == (3, 5)
    assert m.value("samples_spooled_total") == 5
    assert m.value("spool_records") == 0 and spool.records == 0
    assert m.value("errors_total", kind=ErrorKind.SEND.value) == 1


def test_a_broker_that_refuses_idempotence_gets_one_warning_and_a_plain_producer(
    fake_broker, caplog
):
    fake_broker.refuses_idempotence = True
    producer = SampleProducer("fake:9092", "samples")

    async def main() -> int:
        await producer.start()
        producer.add(_round(1))
        sent = await producer.flush()
        await producer.stop()
        await producer.start()  # a reconnect does not ask again
        await producer.stop()
        return sent

    with caplog.at_level(logging.WARNING, logger="tally.collector.producer"):
        assert asyncio.run(main()) == 1
    assert fake_broker.starts == [True, False, False]
    assert not producer.idempotent
    assert producer.metrics.value("producer_idempotent") == 0
    warnings = [r for r in caplog.records if "idempoten" in r.getMessage()]
    assert len(warnings) == 1
    assert "duplicate ids" in warnings[0].getMessage()


def test_a_message_the_broker_refuses_as_too_large_is_dropped_and_counted(fake_broker, tmp_path):
    fake_broker.largest = 10
    producer = SampleProducer("fake:9092", "samples", spool=Spool(tmp_path / "spool"))

    async def main() -> int:
        await producer.start()
        producer.add(_round(1))
        return await producer.flush()

    assert asyncio.run(main()) == 0
    assert producer.metrics.value("samples_dropped_total", reason="rejected") == 1
    assert producer.spool is not None and producer.spool.records == 0
    assert producer.connected  # a refused message says nothing about the connection


@pytest.mark.parametrize("spooled", [True, False], ids=["spool", "no-spool"])
@pytest.mark.parametrize("refusal", ["corrupt", "refuse_on_send"])
def test_a_message_refused_for_its_content_is_dropped_counted_and_the_next_goes_through(
    fake_broker, tmp_path, refusal, spooled
):
    spool = Spool(tmp_path / "spool") if spooled else None
    producer = SampleProducer("fake:9092", "samples", spool=spool)

    async def main() -> list[int]:
        await producer.start()
        setattr(fake_broker, refusal, True)
        producer.add(_round(1))
        refused = await producer.flush()  # never raises, never retries the refused message
        setattr(fake_broker, refusal, False)
        producer.add(_round(2))
        return [refused, await producer.flush(), await producer.flush()]

    assert asyncio.run(main()) == [0, 1, 0]
    assert producer.metrics.value("samples_dropped_total", reason="rejected") == 1
    assert _times(fake_broker.received) == [T0_US + 2 * INTERVAL_US]
    assert producer.pending() == 0 and producer.connected


def test_without_a_spool_unacknowledged_messages_wait_for_the_next_flush(fake_broker):
    producer = SampleProducer("fake:9092", "samples", send_timeout_s=0.05)

    async def main() -> None:
        await producer.start()
        fake_broker.down = True
        producer.add(_round(1))
        with pytest.raises(ProducerError, match="did not take 1 samples"):
            await producer.flush()
        assert producer.pending() == 1
        fake_broker.down = False
        producer.add(_round(2))
        assert await producer.flush() == 2

    asyncio.run(main())
    assert _times(fake_broker.received) == [T0_US + INTERVAL_US, T0_US + 2 * INTERVAL_US]
