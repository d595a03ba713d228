"""The topics Tally creates (`TopicsConfig.specs`): replication, `min.insync.replicas` and
retention per topic; and how an existing topic's difference from its spec reads
(`streams.topics.topic_drift`)."""

from __future__ import annotations

from typing import Any

import pytest

from streams.topics import TopicSpec, TopicState, topic_drift
from tally.config import ConfigError, parse_config
from tests.builders import a_config_dict

HOUR_MS = 3_600_000


def _specs(**topics: Any) -> dict[str, TopicSpec]:
    config = parse_config(a_config_dict(topics=topics))
    by_key = dict(zip(config.topics.all(), config.topics.specs(), strict=True))
    return by_key


def test_the_default_topics_suit_the_embedded_broker_and_keep_jobs_and_admin_forever():
    specs = _specs()
    assert {key: (s.name, s.partitions, s.replication_factor) for key, s in specs.items()} == {
        "samples": ("tally.samples", 8, 1),
        "jobs": ("tally.jobs", 8, 1),
        "admin": ("tally.admin", 8, 1),
        "balances": ("tally.balances", 8, 1),
        "alerts": ("tally.alerts", 8, 1),
        "deadletter": ("tally.deadletter", 8, 1),
        "inventory_reports": ("tally.inventory-reports", 8, 1),
        "inventory": ("tally.inventory", 8, 1),
    }
    forever = {
        "retention.ms": "-1",
        "retention.bytes": "-1",
        "cleanup.policy": "delete",
        "min.insync.replicas": "1",
    }
    assert dict(specs["jobs"].configs) == forever
    assert dict(specs["admin"].configs) == forever
    for compacted in ("balances", "inventory"):
        assert dict(specs[compacted].configs) == {
            "cleanup.policy": "compact",
            "min.insync.replicas": "1",
        }, compacted
    for key, hours in (
        ("samples", 168),
        ("inventory_reports", 168),
        ("alerts", 168),
        ("deadletter", 720),
    ):
        assert dict(specs[key].configs) == {
            "retention.ms": str(hours * HOUR_MS),
            "cleanup.policy": "delete",
            "min.insync.replicas": "1",
        }, key


def test_production_replication_and_retention_come_from_the_config():
    specs = _specs(
        replication_factor=3,
        min_insync_replicas=2,
        retention={"samples_hours": 24, "alerts_hours": 1.5},
        settings={"deadletter": {"replication_factor": 2, "min_insync_replicas": 1}},
    )
    assert specs["jobs"].replication_factor == 3
    assert specs["jobs"].configs["min.insync.replicas"] == "2"
    assert specs["deadletter"].replication_factor == 2
    assert specs["deadletter"].configs["min.insync.replicas"] == "1"
    assert specs["samples"].configs["retention.ms"] == str(24 * HOUR_MS)
    assert specs["alerts"].configs["retention.ms"] == str(int(1.5 * HOUR_MS))
    assert specs["jobs"].configs["retention.ms"] == "-1"


@pytest.mark.parametrize(
    ("topics", "message"),
    [
        pytest.param(
            {"replication_factor": 2, "min_insync_replicas": 3},
            "topics: topics: min_insync_replicas (3) exceeds replication_factor (2) for the "
            "samples topic",
            id="insync-above-replicas",
        ),
        pytest.param(
            {
                "replication_factor": 3,
                "min_insync_replicas": 2,
                "settings": {"jobs": {"replication_factor": 1}},
            },
            "topics: settings.jobs: min_insync_replicas (2) exceeds replication_factor (1)",
            id="override-below-default-insync",
        ),
        pytest.param(
            {"settings": {"jobs": {"min_insync_replicas": 2}}},
            "topics: settings.jobs: min_insync_replicas (2) exceeds replication_factor (1)",
            id="override-above-replicas",
        ),
        pytest.param(
            {"settings": {"metrics": {"replication_factor": 3}}},
            "topics.settings.metrics",
            id="unknown-topic",
        ),
        pytest.param(
            {"retention": {"jobs_hours": 24}},
            "topics.retention.jobs_hours: Extra inputs are not permitted",
            id="jobs-retention-is-not-configurable",
        ),
    ],
)
def test_impossible_topic_settings_are_config_errors(topics: dict[str, Any], message: str):
    with pytest.raises(ConfigError) as err:
        parse_config(a_config_dict(topics=topics), "tally.yaml")
    assert f"tally.yaml: {message}" in str(err.value)


SPEC = TopicSpec("tally.jobs", 8, 3, {"retention.ms": "-1", "cleanup.policy": "delete"})


@pytest.mark.parametrize(
    ("state", "drift"),
    [
        pytest.param(
            TopicState("tally.jobs", 8, 3, {"retention.ms": "-1", "cleanup.policy": "delete"}),
            (),
            id="as-configured",
        ),
        pytest.param(
            TopicState(
                "tally.jobs", 8, 3, {"retention.ms": "604800000", "cleanup.policy": "delete"}
            ),
            ("topic tally.jobs: retention.ms is 604800000, configured -1",),
            id="finite-retention",
        ),
        pytest.param(
            TopicState("tally.jobs", 8, 3, {"retention.ms": "-1"}),
            ("topic tally.jobs: cleanup.policy is the broker's default, configured delete",),
            id="not-reported",
        ),
        pytest.param(
            TopicState("tally.jobs", 4, 1, {"retention.ms": "-1", "cleanup.policy": "compact"}),
            (
                "topic tally.jobs: 4 partitions, configured 8",
                "topic tally.jobs: replication factor 1, configured 3",
                "topic tally.jobs: cleanup.policy is compact, configured delete",
            ),
            id="everything-differs",
        ),
        pytest.param(
            TopicState("tally.jobs", 8, 5, {"retention.ms": "-1", "cleanup.policy": "delete"}),
            (),
            id="more-replicas-is-fine",
        ),
    ],
)
def test_an_existing_topic_is_compared_with_its_spec(state: TopicState, drift: tuple[str, ...]):
    assert topic_drift(SPEC, state) == drift
