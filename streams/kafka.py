"""Kafka plumbing shared by the worker and the stack: reachability, cluster id, topic creation
(`ensure_topics`, the plain form of `streams.topics.ensure_topic_specs`), and which send errors
refuse a message for its content (`content_refusal`).

Every function that connects takes `options`: the security keywords (`security_protocol`,
`ssl_context`, `sasl_*`) every aiokafka client of the process is built with (see
`tally.kafka_clients`).

Library errors (aiokafka's) are translated here into `BrokerError`, the one exception this
module raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from aiokafka import AIOKafkaClient
from aiokafka.errors import (
    CorruptRecordException,
    InvalidTimestampError,
    KafkaError,
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    RecordTooLargeError,
)
from aiokafka.protocol.metadata import MetadataRequest

# Timeouts of a group consumer (aiokafka keywords) unless the configuration says otherwise:
# tansu delays a group's first join by half the session timeout, so the session is short.
DEFAULT_GROUP_OPTIONS: Mapping[str, int] = MappingProxyType(
    {"session_timeout_ms": 6000, "heartbeat_interval_ms": 1000, "rebalance_timeout_ms": 6000}
)


class BrokerError(Exception):
    """The broker cannot be reached or refused what was asked.

    Its message is an English template with named fields (`BrokerError("broker at {bootstrap}
    …", bootstrap=…)`), kept as `template` and `fields`, so that a reader can say it in its own
    language (`say`; the CLI hands in its catalog). The template is the catalog's msgid."""

    def __init__(self, template: str, **fields: object) -> None:
        self.template = template
        self.fields = fields
        super().__init__(template.format(**fields) if fields else template)

    def say(self, translate: Callable[[str], str]) -> str:
        """The message through `translate` (a field that is itself a BrokerError too); the
        fields' values as they are."""
        said = {
            k: v.say(translate) if isinstance(v, BrokerError) else v for k, v in self.fields.items()
        }
        text = translate(self.template)
        return text.format(**said) if said else text


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


async def fetch_cluster_id(
    bootstrap: str, timeout_s: float = 10.0, options: Mapping[str, Any] | None = None
) -> str:
    """The broker's cluster id, from a metadata request: Tally's broker incarnation."""
    client = AIOKafkaClient(
        bootstrap_servers=bootstrap, request_timeout_ms=int(timeout_s * 1000), **(options or {})
    )
    try:
        await asyncio.wait_for(client.bootstrap(), timeout_s)
        node = client.get_random_node()
        response = await asyncio.wait_for(client.send(node, MetadataRequest(topics=[])), timeout_s)
        cluster_id = getattr(response, "cluster_id", None)
        if not cluster_id:
            raise BrokerError("broker at {bootstrap} reported no cluster id", bootstrap=bootstrap)
        return str(cluster_id)
    except (KafkaError, OSError, TimeoutError) as exc:
        raise BrokerError(
            "broker at {bootstrap} did not answer a metadata request: {problem}",
            bootstrap=bootstrap,
            problem=exc,
        ) from exc
    finally:
        await client.close()


async def wait_for_broker(
    bootstrap: str, timeout_s: float = 30.0, options: Mapping[str, Any] | None = None
) -> str:
    """Wait until the broker answers a metadata request; return its cluster id."""
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    quiet = logging.getLogger("aiokafka")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)  # "connection refused" is expected until it listens
    try:
        while time.monotonic() < deadline:
            try:
                return await fetch_cluster_id(bootstrap, min(5.0, timeout_s), options)
            except BrokerError as exc:
                last = exc
                await asyncio.sleep(0.1)
    finally:
        quiet.setLevel(level)
    raise BrokerError(
        "broker at {bootstrap} not ready after {seconds}s: {problem}",
        bootstrap=bootstrap,
        seconds=f"{timeout_s:.0f}",
        problem=last,
    )


async def ensure_topics(
    bootstrap: str,
    names: Sequence[str],
    partitions: int,
    compacted: Sequence[str] = (),
    configs: Mapping[str, str] | None = None,
    options: Mapping[str, Any] | None = None,
) -> None:
    """Create the topics that do not exist yet (existing ones are left as they are), with one
    replica each: what tests and tools need. The stack creates its topics from their specs
    (`streams.topics.ensure_topic_specs`)."""
    from streams.topics import TopicSpec, ensure_topic_specs

    specs = []
    for name in names:
        topic_configs = dict(configs or {})
        if name in compacted:
            topic_configs["cleanup.policy"] = "compact"
        specs.append(TopicSpec(name, partitions, 1, topic_configs))
    await ensure_topic_specs(bootstrap, specs, options)


class ClusterIdentity:
    """Asks the broker for its cluster id over one long-lived connection.

    `current()` answers None when the broker cannot be reached: the caller then keeps what it
    knew (messages already fetched came from the broker it knew).
    """

    def __init__(
        self, bootstrap: str, timeout_s: float = 2.0, options: Mapping[str, Any] | None = None
    ) -> None:
        self.bootstrap = bootstrap
        self.timeout_s = timeout_s
        self.options = dict(options or {})
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
                        **self.options,
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
