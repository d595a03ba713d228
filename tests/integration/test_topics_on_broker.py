"""Against a real tansu broker: `ensure_topic_specs` creates Tally's topics with their
replication and configs (retention, cleanup policy, `min.insync.replicas`), and for a topic
that already exists reports how it differs from its spec (here a `jobs` topic made with a
week's retention), changing nothing. `tally admin apply` prints the same as a warning.

What tansu 0.6.0 (the embedded broker) cannot show: it reports one replica whatever the
replication factor asked (a single broker), and it serves neither TLS nor SASL users on
memory storage, so the security settings are tested as a mapping (`test_kafka_clients.py`),
not against a broker."""

from __future__ import annotations

import asyncio
from pathlib import Path

from click.testing import CliRunner

from streams.kafka import ensure_topics
from streams.topics import ensure_topic_specs
from tally.broker import EmbeddedBroker
from tally.cli import cli
from tally.config import parse_config
from tests.builders import a_config_dict
from tests.conftest import write_config

WEEK_MS = "604800000"


def test_topics_are_created_from_their_specs_and_an_existing_one_is_checked(
    broker: EmbeddedBroker,
):
    topics = parse_config(a_config_dict(topics={"partitions": 2})).topics
    # The jobs topic as an older Tally (or an operator) made it: a week's retention.
    asyncio.run(
        ensure_topics(broker.bootstrap, [topics.jobs], 2, configs={"retention.ms": WEEK_MS})
    )

    first = asyncio.run(ensure_topic_specs(broker.bootstrap, topics.specs()))
    assert sorted(first.created) == sorted(n for n in topics.all().values() if n != topics.jobs)
    jobs_drift = (
        "topic tally.jobs: cleanup.policy is the broker's default, configured delete",
        "topic tally.jobs: min.insync.replicas is the broker's default, configured 1",
        "topic tally.jobs: retention.bytes is the broker's default, configured -1",
        f"topic tally.jobs: retention.ms is {WEEK_MS}, configured -1",
    )
    assert first.drift == jobs_drift

    # The topics just created read back as specified: only the old jobs topic differs.
    again = asyncio.run(ensure_topic_specs(broker.bootstrap, topics.specs()))
    assert again.created == ()
    assert again.drift == jobs_drift


def test_admin_apply_warns_about_an_admin_topic_that_is_not_kept_forever(
    broker: EmbeddedBroker, tmp_path: Path
):
    data = a_config_dict(
        topics={"partitions": 2, "admin": "t.admin", "retention": {"samples_hours": 1}},
        ledger={"data_dir": str(tmp_path / "data")},
    )
    asyncio.run(ensure_topics(broker.bootstrap, ["t.admin"], 2, configs={"retention.ms": "1000"}))
    path = write_config(tmp_path / "tally.yaml", data)
    result = CliRunner().invoke(
        cli, ["admin", "apply", str(path), "--initial", "--bootstrap", broker.bootstrap]
    )
    assert result.exit_code == 0, result.output
    assert (
        "warning: topic t.admin: retention.ms is 1000, configured -1 "
        "(Tally does not change an existing topic)"
    ) in result.stderr
