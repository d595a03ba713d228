"""Kafka plumbing shared by the worker and the stack: reachability, cluster id, topic creation,
and which send errors refuse a message for its content (`content_refusal`).

Library errors (aiokafka's) are translated here into `BrokerError`, the one exception this
module raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping, Sequence

from aiokafka import AIOKafkaClient
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import (
    CorruptRecordException,
    InvalidTimestampError,
    KafkaError,
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    RecordTooLargeError,
    TopicAlreadyExistsError,
)
from aiokafka.protocol.metadata import MetadataRequest


class BrokerError(Exception):
    """The broker cannot be reached or refused what was asked."""


# The broker (or the client, before sending) refuses these for the message itself: sending the
# same message again can never succeed. Anything else (a connection lost, a timeout, a leader
# moving) says nothing about the message and is worth trying again.
CONTENT_REFUSALS: tuple[type[KafkaError], ...] = (
    MessageSizeTooLargeError,
    RecordTooLargeError,
    RecordListTooLargeError,
    CorruptRecordException,  # aiokafka's InvalidMessageError
    InvalidTimestampError,
)


def content_refusal(exc: BaseException) -> KafkaError | None:
    """The error in `exc` or its causes (Faust wraps aiokafka's in `ProducerSendError`) that
    refuses a message for its content, or None when `exc` is no such refusal."""
    cause: BaseException | None = exc
    for _ in range(8):  # a cause chain is short; a cycle must not hang
        if cause is None:
            return None
        if isinstance(cause, CONTENT_REFUSALS):
            return cause
        cause = cause.__cause__
    return None


async def fetch_cluster_id(bootstrap: str, timeout_s: float = 10.0) -> str:
    """The broker's cluster id, from a metadata request: Tally's broker incarnation."""
    client = AIOKafkaClient(bootstrap_servers=bootstrap, request_timeout_ms=int(timeout_s * 1000))
    try:
        await asyncio.wait_for(client.bootstrap(), timeout_s)
        node = client.get_random_node()
        response = await asyncio.wait_for(client.send(node, MetadataRequest(topics=[])), timeout_s)
        cluster_id = getattr(response, "cluster_id", None)
        if not cluster_id:
            raise BrokerError(f"broker at {bootstrap} reported no cluster id")
        return str(cluster_id)
    except (KafkaError, OSError, TimeoutError) as exc:
        raise BrokerError(
            f"broker at {bootstrap} did not answer a metadata request: {exc}"
        ) from exc
    finally:
        await client.close()


async def wait_for_broker(bootstrap: str, timeout_s: float = 30.0) -> str:
    """Wait until the broker answers a metadata request; return its cluster id."""
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    quiet = logging.getLogger("aiokafka")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)  # "connection refused" is expected until it listens
    try:
        while time.monotonic() < deadline:
            try:
                return await fetch_cluster_id(bootstrap, timeout_s=min(5.0, timeout_s))
            except BrokerError as exc:
                last = exc
                await asyncio.sleep(0.1)
    finally:
        quiet.setLevel(level)
    raise BrokerError(f"broker at {bootstrap} not ready after {timeout_s:.0f}s: {last}")


async def ensure_topics(
    bootstrap: str,
    names: Sequence[str],
    partitions: int,
    compacted: Sequence[str] = (),
    configs: Mapping[str, str] | None = None,
) -> None:
    """Create the topics that do not exist yet (existing ones are left as they are)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    try:
        await admin.start()
        existing = set(await admin.list_topics())
        wanted = []
        for name in names:
            if name in existing:
                continue
            topic_configs = dict(configs or {})
            if name in compacted:
                topic_configs["cleanup.policy"] = "compact"
            wanted.append(NewTopic(name, partitions, 1, topic_configs=topic_configs))
        if wanted:
            with contextlib.suppress(TopicAlreadyExistsError):  # a concurrent creator won
                await admin.create_topics(wanted)
    except KafkaError as exc:
        raise BrokerError(f"could not create topics on {bootstrap}: {exc}") from exc
    finally:
        await admin.close()


class ClusterIdentity:
    """Asks the broker for its cluster id over one long-lived connection.

    `current()` answers None when the broker cannot be reached: the caller then keeps what it
    knew (messages already fetched came from the broker it knew).
    """

    def __init__(self, bootstrap: str, timeout_s: float = 2.0) -> None:
        self.bootstrap = bootstrap
        self.timeout_s = timeout_s
        self._client: AIOKafkaClient | None = None
        self._asking = asyncio.Lock()  # one question at a time over the one connection

    async def current(self) -> str | None:
        async with self._asking:
            try:
                client = self._client
                if client is None:
                    client = AIOKafkaClient(
                        bootstrap_servers=self.bootstrap,
                        request_timeout_ms=int(self.timeout_s * 1000),
                    )
                    self._client = client
                    await asyncio.wait_for(client.bootstrap(), self.timeout_s)
                node = client.get_random_node()
                if node is None:
                    raise KafkaError("no broker in the metadata")
                response = await asyncio.wait_for(
                    client.send(node, MetadataRequest(topics=[])), self.timeout_s
                )
            except (KafkaError, OSError, TimeoutError):
                await self.close()
                return None
        cluster_id = getattr(response, "cluster_id", None)
        return str(cluster_id) if cluster_id else None

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                await client.close()
