"""The collector's aiokafka adapter: the one place `SampleProducer` (`collectors.producer`)
meets aiokafka's producer, its protocol classes and its errors.

This module owns:
- `new_kafka_producer`: an `AIOKafkaProducer` with `acks=all`, batching and compression, and
  (when idempotent) the InitProducerId v3 request below;
- `abandon`: closing a producer whose broker is gone without waiting for the broker;
- which errors mean what: `BROKER_ERRORS` (what talking to the broker raises; callers see
  them only as `ProducerError`), `REJECTED` (the broker refuses the message itself: resending
  can never succeed) and `refuses_idempotence` (the broker answered, and said no);
- `CODECS`: the compression codecs and whether each is available here.

Idempotence and tansu: aiokafka 0.14 asks for a producer id with InitProducerId v0, which has
no producer id / epoch fields; tansu (0.6) reads those fields as absent and answers
UnknownError (its log says `producer=None epoch=None`). Version 3 of the request carries
`producer_id=-1, producer_epoch=-1` ("a new producer"), which tansu and Apache Kafka both
accept, so this module sends v3 when the broker supports it (tansu and Kafka ≥ 2.5 do). A
broker that still refuses gets ONE warning, `tally_collector_producer_idempotent 0`, and a
producer without idempotence for the rest of the process: resends are harmless (see
`collectors.producer`). The aiokafka internals this touches (`Sender._do_init_pid`,
`MessageAccumulator.fail_all`) sit here, with aiokafka pinned to 0.14.0.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from typing import Any

from aiokafka import AIOKafkaProducer, codec
from aiokafka.errors import (
    IncompatibleBrokerVersion,
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    NodeNotReadyError,
    RequestTimedOutError,
)
from aiokafka.producer.sender import InitPIDHandler
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.transaction import InitProducerIdRequest_v0
from aiokafka.protocol.types import CompactString, Int16, Int32, Int64, Schema, TaggedFields

from streams.kafka import CONTENT_REFUSALS

CODECS: dict[str, Callable[[], bool]] = {
    "gzip": codec.has_gzip,
    "lz4": codec.has_lz4,
    "zstd": codec.has_zstd,
    "snappy": codec.has_snappy,
}
# The broker refuses these for the message itself (too large, corrupt): resending can never
# succeed. The one list every Tally producer shares (`streams.kafka`).
REJECTED = CONTENT_REFUSALS
# These say nothing about idempotence: the broker did not answer at all.
_UNREACHABLE = (KafkaConnectionError, NodeNotReadyError, RequestTimedOutError, KafkaTimeoutError)
# What talking to the broker raises: caught only as these, and raised to callers only as
# `ProducerError` (by `collectors.producer`: a failed connect, or a flush the broker did not
# take).
BROKER_ERRORS = (KafkaError, OSError, TimeoutError)


class _InitProducerIdResponseV3(Response):  # type: ignore[misc]
    API_KEY = 22
    API_VERSION = 3
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("error_code", Int16),
        ("producer_id", Int64),
        ("producer_epoch", Int16),
        ("tags", TaggedFields),
    )


class _InitProducerIdRequestV3(RequestStruct):  # type: ignore[misc]
    API_KEY = 22
    API_VERSION = 3
    FLEXIBLE_VERSION = True
    RESPONSE_TYPE = _InitProducerIdResponseV3
    SCHEMA = Schema(
        ("transactional_id", CompactString("utf-8")),
        ("transaction_timeout_ms", Int32),
        ("producer_id", Int64),
        ("producer_epoch", Int16),
        ("tags", TaggedFields),
    )


class _InitProducerId(Request[InitProducerIdRequest_v0 | _InitProducerIdRequestV3]):  # type: ignore[misc]
    """InitProducerId, v3 where the broker has it (a new producer: id and epoch -1), else v0."""

    API_KEY = 22

    def __init__(self, transactional_id: str | None, transaction_timeout_ms: int) -> None:
        self._transactional_id = transactional_id
        self._timeout_ms = transaction_timeout_ms

    def build(
        self, request_struct_class: type[InitProducerIdRequest_v0 | _InitProducerIdRequestV3]
    ) -> InitProducerIdRequest_v0 | _InitProducerIdRequestV3:
        if request_struct_class is _InitProducerIdRequestV3:
            return _InitProducerIdRequestV3(self._transactional_id, self._timeout_ms, -1, -1, {})
        return InitProducerIdRequest_v0(self._transactional_id, self._timeout_ms)


class _InitPidHandler(InitPIDHandler):  # type: ignore[misc]
    def create_request(self) -> _InitProducerId:
        txn = self._sender._txn_manager
        return _InitProducerId(txn.transactional_id, txn.transaction_timeout_ms)


def new_kafka_producer(
    bootstrap: str,
    client_id: str,
    linger_ms: int,
    compression: str | None,
    idempotent: bool,
    options: Mapping[str, Any] | None = None,
) -> AIOKafkaProducer:
    """An aiokafka producer; `options`: the security keywords (SASL, TLS) of every client."""
    producer = AIOKafkaProducer(
        **(options or {}),
        bootstrap_servers=bootstrap,
        client_id=client_id,
        acks="all",
        enable_idempotence=idempotent,
        compression_type=compression,
        linger_ms=linger_ms,
        max_batch_size=1 << 20,
        max_request_size=1 << 21,
    )
    if idempotent:
        sender = producer._sender

        async def init_pid(node_id: int) -> bool:
            return bool(await _InitPidHandler(sender).do(node_id))

        sender._do_init_pid = init_pid
    return producer


async def abandon(producer: AIOKafkaProducer) -> None:
    """Close a producer whose broker is gone without waiting for the broker.

    An idempotent aiokafka producer retries a batch forever and `stop()` waits for every batch,
    so `stop()` is not used: the sender task is cancelled and the connections closed. What the
    abandoned batches carry is in the spool already; their futures never complete.
    """
    task = producer._sender.sender_task
    if task is not None and not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=5.0)
    with contextlib.suppress(KafkaError, OSError):
        await producer.client.close()
    producer._closed = True


def refuses_idempotence(exc: BaseException) -> bool:
    """The broker answered the producer-id request, with an error (not a connection failure)."""
    if isinstance(exc, IncompatibleBrokerVersion):
        return True
    return isinstance(exc, KafkaError) and not isinstance(exc, _UNREACHABLE)
