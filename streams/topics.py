"""The topics Tally creates, as values (`TopicSpec`), and creating and checking them.

`ensure_topic_specs` creates the topics that do not exist with their partitions, replication
factor and configs (retention, cleanup policy, `min.insync.replicas`), and describes the ones
that do: an existing topic is never changed, but every way it differs from its spec (a `jobs`
topic with a finite retention, a compacted one that should not be, too few replicas) is
returned by `topic_drift` and logged as a warning on `tally.topics`.

The values import nothing of aiokafka, so the configuration can build specs cheaply.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aiokafka.admin import AIOKafkaAdminClient

log = logging.getLogger("tally.topics")


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """A topic as Tally wants it."""

    name: str
    partitions: int
    replication_factor: int = 1
    configs: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TopicState:
    """A topic as the broker describes it: partitions, the replicas of its first partition,
    and the configs it reported (a broker may leave out those at their default)."""

    name: str
    partitions: int
    replication_factor: int
    configs: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class TopicsReport:
    created: tuple[str, ...]
    drift: tuple[str, ...]  # one line per difference between an existing topic and its spec


def topic_drift(spec: TopicSpec, state: TopicState) -> tuple[str, ...]:
    """How an existing topic differs from its spec, one readable line per difference."""
    out = []
    if state.partitions != spec.partitions:
        out.append(
            f"topic {spec.name}: {state.partitions} partitions, configured {spec.partitions}"
        )
    if state.replication_factor < spec.replication_factor:
        out.append(
            f"topic {spec.name}: replication factor {state.replication_factor}, configured "
            f"{spec.replication_factor}"
        )
    for key, wanted in sorted(spec.configs.items()):
        actual = state.configs.get(key)
        if actual is None:
            out.append(f"topic {spec.name}: {key} is the broker's default, configured {wanted}")
        elif actual != wanted:
            out.append(f"topic {spec.name}: {key} is {actual}, configured {wanted}")
    return tuple(out)


async def ensure_topic_specs(
    bootstrap: str, specs: Sequence[TopicSpec], options: Mapping[str, Any] | None = None
) -> TopicsReport:
    """Create the topics of `specs` that do not exist; describe the others and report (and
    log) how each differs from its spec. `options`: the clients' security keywords."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.errors import KafkaError, TopicAlreadyExistsError

    from streams.kafka import BrokerError

    admin = AIOKafkaAdminClient(
        bootstrap_servers=bootstrap, request_timeout_ms=10_000, **(options or {})
    )
    try:
        await admin.start()
        existing = set(await admin.list_topics())
        wanted = [s for s in specs if s.name not in existing]
        if wanted:
            new = [
                NewTopic(s.name, s.partitions, s.replication_factor, topic_configs=dict(s.configs))
                for s in wanted
            ]
            with contextlib.suppress(TopicAlreadyExistsError):  # a concurrent creator won
                await admin.create_topics(new)
        present = [s for s in specs if s.name in existing]
        drift: list[str] = []
        if present:
            states = await _describe(admin, [s.name for s in present])
            for spec in present:
                state = states.get(spec.name)
                if state is not None:
                    drift.extend(topic_drift(spec, state))
    except KafkaError as exc:
        raise BrokerError(
            "could not create topics on {bootstrap}: {problem}", bootstrap=bootstrap, problem=exc
        ) from exc
    finally:
        await admin.close()
    for line in drift:
        log.warning("%s (Tally does not change an existing topic)", line)
    return TopicsReport(tuple(s.name for s in wanted), tuple(drift))


async def _describe(admin: AIOKafkaAdminClient, names: list[str]) -> dict[str, TopicState]:
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    described = await admin.describe_topics(names)
    shape: dict[str, tuple[int, int]] = {}
    for topic in described:
        if topic.get("error_code", 0) != 0:
            continue
        partitions = topic["partitions"]
        replicas = min((len(p["replicas"]) for p in partitions), default=0)
        shape[str(topic["topic"])] = (len(partitions), replicas)
    resources = [ConfigResource(ConfigResourceType.TOPIC, name) for name in shape]
    configs: dict[str, dict[str, str]] = {name: {} for name in shape}
    for response in await admin.describe_configs(resources):
        for resource in response.resources:
            error_code, _message, _type, name, entries = resource[:5]
            if error_code != 0 or name not in configs:
                continue
            for entry in entries:
                key, value = entry[0], entry[1]
                if value is not None:
                    configs[name][str(key)] = str(value)
    return {
        name: TopicState(name, parts, replicas, configs[name])
        for name, (parts, replicas) in shape.items()
    }
