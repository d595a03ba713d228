"""The sample producer: carries sample envelopes to the samples topic, keyed by GPU UUID.

Samples are buffered per GPU between `flush()` calls and each GPU's buffer goes out as one
message (a CloudEvents JSON batch), so a collector that packs several rounds per flush sends
few large messages instead of many small ones. `flush()` returns only after the broker has
acknowledged every message (`acks=all`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from ledger.events import Envelope, encode_batch


class ProducerError(Exception):
    """The broker did not take what the producer sent."""


class SampleProducer:
    """Buffers envelopes per GPU and sends each GPU's buffer as one message on `flush()`."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        client_id: str = "tally-collector",
        linger_ms: int = 5,
        max_message_bytes: int = 900_000,
    ) -> None:
        self.topic = topic
        self.max_message_bytes = max_message_bytes
        self._producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            client_id=client_id,
            acks="all",
            linger_ms=linger_ms,
            max_batch_size=1 << 20,
            max_request_size=1 << 21,
        )
        self._buffers: dict[str, list[Envelope]] = {}
        self.sent_messages = 0
        self.sent_samples = 0

    async def start(self) -> None:
        try:
            await self._producer.start()
        except KafkaError as exc:
            await self._producer.stop()
            raise ProducerError(f"cannot connect the producer: {exc}") from exc

    async def stop(self) -> None:
        await self._producer.stop()

    def add(self, envelopes: Iterable[Envelope]) -> None:
        for envelope in envelopes:
            self._buffers.setdefault(envelope.data.gpu_uuid, []).append(envelope)

    def pending(self) -> int:
        return sum(len(b) for b in self._buffers.values())

    async def flush(self) -> int:
        """Send every buffered sample; wait for the broker's acknowledgement of all of them."""
        buffers, self._buffers = self._buffers, {}
        futures = []
        samples = 0
        try:
            for key, envelopes in buffers.items():
                for chunk in self._chunks(envelopes):
                    futures.append(
                        await self._producer.send(self.topic, key=key.encode(), value=chunk)
                    )
                samples += len(envelopes)
            await asyncio.gather(*futures)
        except KafkaError as exc:
            raise ProducerError(f"the broker did not take the samples: {exc}") from exc
        self.sent_messages += len(futures)
        self.sent_samples += samples
        return samples

    def _chunks(self, envelopes: list[Envelope]) -> Iterable[bytes]:
        value = encode_batch(envelopes)
        if len(value) <= self.max_message_bytes or len(envelopes) == 1:
            yield value
            return
        half = len(envelopes) // 2
        yield from self._chunks(envelopes[:half])
        yield from self._chunks(envelopes[half:])
