"""Crash safety: SIGKILL the worker at random moments during an ingest mixed with garbage and
resends; after the restarts the ledger holds every sample exactly once, every garbage message
is a dead letter, and `tally ledger verify` and `tally ledger rebuild` pass.

Two sizes of the same campaign: 12 kills during ~80,000 samples runs in `make test`; 20 kills
during 1,000,000 samples is the soak (`make soak`, i.e. `TALLY_SOAK=1`), skipped otherwise.
Both print their figures: kills, samples, resends, garbage, dead letters, wall time, exactness.

The producer (a thread) sends simulated rounds, packed 4 to a message per GPU; at random points
it sends garbage (not JSON, JSON of the wrong shape, envelopes with wrongly typed fields) and
resends earlier rounds (the same events again: duplicates, never booked twice). What the ledger
must hold is computed independently as the rounds are produced (`support.Expected`). It holds
back the last tenth of the rounds until the kills are done (sending a trickle of resends
meanwhile), so every kill lands mid-ingest. A kill lands while the restarted worker starts up
(about 2 in 5) or a moment after it committed a batch; kill k of n comes no earlier than when
the ledger holds about k/n of the samples, so the kills are spread over the whole ingest.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import orjson
import pytest

from collectors.producer import SampleProducer
from collectors.simulated import SimulatedFleet
from ledger.events import SampleEnvelope, envelope_to_dict
from ledger.read.queries import LedgerQueries
from ledger.store.layout import HOT_DB_NAME
from tests.conftest import child_env, create_topics, tally_command
from tests.integration.support import (
    Expected,
    WorkerProcess,
    fleet_of,
    gpu_ms_by_team_and_gpu,
    load,
    pipeline_config,
    rounds,
    sealed_transactions,
    wait_until,
)

pytestmark = [pytest.mark.broker, pytest.mark.slow]

GPUS = 64  # pipeline_config(nodes=4): 2 pools × 4 nodes × 8 GPUs
PACK = 4  # rounds per message per GPU
HELD_BACK = 0.1  # the share of rounds sent only after the last kill
RESEND_POOL = 256  # rounds kept to be sent again
STARTUP_KILLS = 0.4  # the share of kills that land while the restarted worker starts up


@dataclass(frozen=True, slots=True)
class Campaign:
    kills: int
    samples: int
    garbage_every: int  # on average one garbage message per this many packs
    resend_every: int  # on average one earlier round sent again per this many packs
    pause_s: float  # between packs, so the kills land while data is still arriving

    @property
    def rounds(self) -> int:
        return -(-self.samples // GPUS)


REDUCED = Campaign(kills=12, samples=80_000, garbage_every=8, resend_every=4, pause_s=0.1)
FULL = Campaign(kills=20, samples=1_000_000, garbage_every=25, resend_every=10, pause_s=0.0)


@dataclass
class Production:
    """What the producer thread sent, and its failure if any."""

    expected: Expected
    garbage: int = 0
    resent_samples: int = 0
    messages: int = 0
    failure: list[BaseException] = field(default_factory=list)


def garbage_message(rng: random.Random, like: SampleEnvelope, n: int) -> tuple[bytes, bytes]:
    """One message the ledger must refuse as one dead letter: not JSON, JSON of the wrong
    shape, or an envelope (a copy of `like`) with a field of the wrong type."""
    kind = n % 4
    if kind == 0:
        return b"garbage", bytes(rng.randrange(256) for _ in range(40)) + b"\xff not json"
    if kind == 1:
        return b"garbage", orjson.dumps({"hello": "a sample batch is a list", "n": n})
    record = envelope_to_dict(like)
    record["id"] = f"garbage-{n}"
    if kind == 2:
        record["data"]["util_gpu_pct"] = "ninety"
    else:
        record["time"] = "yesterday"
    return record["data"]["gpu_uuid"].encode(), orjson.dumps([record])


async def produce_campaign(
    bootstrap: str,
    topic: str,
    fleet: SimulatedFleet,
    campaign: Campaign,
    rng: random.Random,
    out: Production,
    kills_done: threading.Event,
) -> None:
    producer = SampleProducer(bootstrap, topic)
    garbage = producer.topic_sender(topic)
    await producer.start()
    hold_from = int(campaign.rounds * (1 - HELD_BACK))
    sent: list[list[SampleEnvelope]] = []  # a uniform sample of the rounds sent so far
    try:
        for first in range(0, campaign.rounds, PACK):
            while first >= hold_from and not kills_done.is_set():
                # a trickle of resends, so the worker has something to commit after a restart
                producer.add(rng.choice(sent))
                out.resent_samples += GPUS
                await producer.flush()
                await asyncio.sleep(0.25)
            if sent and rng.randrange(campaign.resend_every) == 0:
                again = rng.choice(sent)  # the same events, sent in an earlier pack
                out.expected.add(again)  # already there: changes nothing
                producer.add(again)
                out.resent_samples += len(again)
            for index, batch in enumerate(rounds(fleet, first, min(PACK, campaign.rounds - first))):
                out.expected.add(batch)
                producer.add(batch)
                seen = first + index + 1
                if len(sent) < RESEND_POOL:
                    sent.append(batch)
                elif (slot := rng.randrange(seen)) < RESEND_POOL:
                    sent[slot] = batch
            if rng.randrange(campaign.garbage_every) == 0:
                garbage(*garbage_message(rng, batch[0], out.garbage))
                out.garbage += 1
            await producer.flush()
            if campaign.pause_s:
                await asyncio.sleep(campaign.pause_s)
        await producer.flush()
        out.messages = producer.sent_messages
    finally:
        await producer.stop()


def logged(worker_log: Path, what: str) -> int:
    """The sum of `N <what>` over the worker's `batch committed` lines."""
    pattern = re.compile(rf"(\d+) {what}\b")
    return sum(
        int(m.group(1))
        for line in worker_log.read_text(errors="replace").splitlines()
        if "batch committed" in line
        for m in [pattern.search(line)]
        if m
    )


def dead_letters_in_store(data_dir: Path) -> int:
    with duckdb.connect(str(data_dir / HOT_DB_NAME), read_only=True) as con:
        row = con.execute("SELECT count(*) FROM dead_letters").fetchone()
    assert row is not None
    return int(row[0])


def tally(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        tally_command(*args), capture_output=True, text=True, env=child_env(), check=False
    )


@pytest.mark.parametrize(
    "campaign",
    [
        pytest.param(REDUCED, id="12-kills-80k-samples"),
        pytest.param(
            FULL,
            id="20-kills-1M-samples",
            marks=[
                pytest.mark.skipif(
                    not os.environ.get("TALLY_SOAK"), reason="the soak: make soak (TALLY_SOAK=1)"
                ),
                pytest.mark.timeout(3 * 3600),
            ],
        ),
    ],
)
def test_sigkills_amid_garbage_and_resends_lose_nothing_and_count_nothing_twice(
    broker, tmp_path, campaign
):
    seed = int(os.environ.get("TALLY_CRASH_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    started = time.monotonic()
    config, path = load(tmp_path, pipeline_config(tmp_path, nodes=4))
    create_topics(broker.bootstrap, list(config.topics.all().values()), 4)
    fleet = fleet_of(config)
    assert len(fleet.gpus) == GPUS
    data_dir = config.ledger.data_dir
    out = Production(Expected(config))
    kills_done = threading.Event()

    def producer() -> None:
        try:
            asyncio.run(
                produce_campaign(
                    broker.bootstrap,
                    config.topics.samples,
                    fleet,
                    campaign,
                    random.Random(rng.random()),
                    out,
                    kills_done,
                )
            )
        except BaseException as exc:  # surfaced below
            out.failure.append(exc)

    thread = threading.Thread(target=producer, daemon=True)
    thread.start()
    worker_log = tmp_path / "worker.log"
    worker = WorkerProcess(path, broker.bootstrap, worker_log).start()
    total = campaign.rounds * GPUS
    kill_points: list[int] = []
    moments: list[str] = []
    try:
        for kill in range(campaign.kills):
            if rng.random() < STARTUP_KILLS:  # while it starts, joins the group, takes a batch
                time.sleep(rng.uniform(0.5, 4.0))
                moments.append("starting")
            else:  # while it ingests, commits and seals: spread over the ingest
                target = int(total * (1 - HELD_BACK) * 0.95 * kill / campaign.kills)
                before = worker.commits()
                wait_until(
                    lambda b=before, t=target: (
                        worker.commits() > b and sealed_transactions(data_dir) >= t
                    ),
                    1800,
                    f"the worker to commit after restart {kill} (seed {seed})",
                    worker,
                    interval_s=0.5,
                )
                time.sleep(rng.uniform(0.0, 1.0))
                moments.append("ingesting")
            sealed = sealed_transactions(data_dir)
            assert sealed < total, f"kill {kill} after the ingest (seed {seed})"
            kill_points.append(sealed)
            worker.kill()
            worker.start()
        kills_done.set()
        thread.join(3600)
        assert not thread.is_alive() and not out.failure, out.failure
        samples = out.expected.samples
        assert samples == total
        wait_until(
            lambda: sealed_transactions(data_dir) == samples,
            3600,
            f"all {samples} samples to be sealed (seed {seed})",
            worker,
            interval_s=1.0,
        )
        time.sleep(1.0)  # anything counted twice would show up in a later seal
    finally:
        kills_done.set()
        worker.stop()
    ingest_s = time.monotonic() - started

    # exact: every sample once, GPU-ms per team and GPU to the millisecond
    assert sealed_transactions(data_dir) == samples, f"seed {seed}"
    assert LedgerQueries(data_dir).balances() == out.expected.balances(), f"seed {seed}"
    booked = gpu_ms_by_team_and_gpu(data_dir)
    assert booked == out.expected.gpu_ms_by_team_and_gpu(), f"seed {seed}"
    # every garbage message became one dead letter; resends were dropped as duplicates
    assert out.garbage > 0 and out.resent_samples > 0
    dead = dead_letters_in_store(data_dir)
    assert dead == out.garbage, f"{dead} dead letters for {out.garbage} garbage (seed {seed})"
    duplicates = logged(worker_log, "duplicates")
    # a batch's log line can die with a kill after its commit, never appear twice
    assert duplicates <= out.resent_samples, f"seed {seed}"

    verified = tally("ledger", "verify", "--config", str(path))
    assert verified.returncode == 0, verified.stdout + verified.stderr
    fresh = tmp_path / "rebuilt"
    rebuilt = tally("ledger", "rebuild", "--config", str(path), "--into", str(fresh), "--keep")
    assert rebuilt.returncode == 0, rebuilt.stdout + rebuilt.stderr
    assert LedgerQueries(fresh).balances() == out.expected.balances(), f"seed {seed}"
    assert gpu_ms_by_team_and_gpu(fresh) == booked, f"seed {seed}"
    figures = {
        "seed": seed,
        "kills": campaign.kills,
        "kills_while_starting": moments.count("starting"),
        "kills_while_ingesting": moments.count("ingesting"),
        "samples": samples,
        "resent_samples": out.resent_samples,
        "duplicates_logged": duplicates,
        "garbage": out.garbage,
        "dead_letters": dead,
        "messages": out.messages,
        "gpu_ms_exact": True,
        "teams_gpus_checked": len(booked),
        "gpu_ms_total": sum(booked.values()),
        "verify": "ok",
        "rebuild": "identical",
        "ingest_wall_s": round(ingest_s, 1),
        "total_wall_s": round(time.monotonic() - started, 1),
        "killed_at_sealed": kill_points,
    }
    print(f"crash campaign: {json.dumps(figures)}")
