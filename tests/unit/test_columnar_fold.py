"""The samples fold's column-built fast path gives exactly the rows of the per-sample path.

Generated batches mix whole GPUs and MIG slices, owners named by the sample, by one process or
by several (shared GPUs), unowned GPUs and MIG instances the scheduler assigned (from a time
inside the batch), GPU shares (one released inside the batch while its idle alert is open, one
held on: per-share idle detection), team-less owners whose job's owner the ledger knows (late
owners: completed) or does not (booked awaiting it), jobs with open holds, energy with and
without an energy price, price changes inside intervals, unpriced models, closed periods, idle
stretches long enough to raise and resolve alerts, duplicates (inside the batch and against the
store), samples too late to deduplicate (their GPU's dedupe cutoff passed) and undecodable
messages.
Both paths fold the same decoded batch against the same view; every posting row, dead letter,
idle state, alert and state change must be identical.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger.assignments import Holding
from ledger.dedupe import sample_scope
from ledger.events import decode_message, encode_batch, envelope_for
from ledger.fractional import share_key
from ledger.holds import OpenHold
from ledger.idle import GpuIdleState, IdlePolicy
from ledger.ingest.batch import Folded, FoldRules, decode_all
from ledger.ingest.samples import fold_samples
from ledger.periods import period_label
from ledger.pricing import EnergyPrice, Price, PriceBook
from ledger.store.port import ConsumedMessage, LedgerView
from ledger.store.schema import columns_to_arrow, transactions_to_arrow
from ledger.units import Unit
from tests.builders import INTERVAL_US, T0_US, a_mig, a_process, a_sample, an_owner

GPUS = tuple(f"GPU-00000000-0000-0000-0000-00000000000{i}" for i in range(3))
H100 = "NVIDIA H100 80GB HBM3"
UNPRICED = "NVIDIA T4"
OWNERS = (
    an_owner(),
    an_owner(team="search", project="ranking", user="bo", job_id="job-2"),
    an_owner(team="vision", project=None, user=None, job_id=None),
)
POLICY = IdlePolicy(threshold_pct=5, min_duration_us=3 * INTERVAL_US, resolve_pct=10,
                    resolve_duration_us=2 * INTERVAL_US)  # fmt: skip


@st.composite
def sample_specs(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "gpu": draw(st.integers(0, len(GPUS) - 1)),
        "step": draw(st.integers(1, 12)),
        "mig": draw(st.sampled_from([None, 1, 3])),
        "holder": draw(st.sampled_from(["sample", "process", "unowned", "shared", "teamless"])),
        "owner": draw(st.integers(0, len(OWNERS) - 1)),
        "util": draw(st.sampled_from([0, 1, 7, 50, 95])),
        "energy": draw(st.sampled_from([None, 0, 1_234_567])),
        "model": draw(st.sampled_from([H100, H100, H100, UNPRICED])),
        "resend": draw(st.booleans()),
    }


def _sample(spec: dict[str, Any]) -> Any:
    owner = OWNERS[spec["owner"]]
    other = OWNERS[(spec["owner"] + 1) % len(OWNERS)]
    processes: tuple[Any, ...] = ()
    sample_owner = None
    match spec["holder"]:
        case "sample":
            sample_owner = owner
        case "process":
            processes = (a_process(owner=owner),)
        case "unowned":
            processes = (a_process(owner=None),)
        case "shared":
            processes = (a_process(pid=1, sm=30, owner=owner), a_process(pid=2, sm=60, owner=other))
        case "teamless":
            processes = (a_process(owner=replace(owner, team=None)),)
    mig = None if spec["mig"] is None else a_mig(slices=spec["mig"], gi=spec["mig"])
    return a_sample(
        gpu_uuid=GPUS[spec["gpu"]],
        model=spec["model"],
        sample_time_us=T0_US + spec["step"] * INTERVAL_US + 1_234,
        util_gpu_pct=spec["util"],
        mig=mig,
        owner=sample_owner,
        processes=processes,
        energy_delta_mj=spec["energy"],
    )


@st.composite
def batches(draw: st.DrawFn) -> tuple[list[ConsumedMessage], LedgerView, FoldRules]:
    specs = draw(st.lists(sample_specs(), min_size=1, max_size=40))
    envelopes = [envelope_for(_sample(spec), "sim://node-01") for spec in specs]
    values: list[bytes] = []
    for spec, envelope in zip(specs, envelopes, strict=True):
        values.append(encode_batch([envelope]))
        if spec["resend"]:
            values.append(encode_batch([envelope]))
    for index in draw(st.lists(st.integers(0, len(values)), max_size=3)):
        values.insert(index, draw(st.sampled_from([b"{not json", b"[]", b'{"type": 1}', b""])))
    messages = [ConsumedMessage("samples", 0, n, v) for n, v in enumerate(values)]
    ids = [e.id for e in envelopes]
    seen = frozenset(draw(st.lists(st.sampled_from(ids), max_size=3)))
    assigned = draw(st.lists(st.integers(0, len(GPUS) - 1), max_size=2, unique=True))
    timelines = {
        GPUS[g]: (Holding(GPUS[g], OWNERS[1], T0_US + draw(st.integers(0, 6)) * INTERVAL_US),)
        for g in assigned
    }
    for subject in draw(st.lists(st.sampled_from([e.subject for e in envelopes]), max_size=2)):
        since = T0_US + draw(st.integers(0, 6)) * INTERVAL_US  # a MIG instance's own, or a GPU's
        timelines[subject] = (Holding(subject, OWNERS[0], since),)
    idle: dict[str, GpuIdleState] = {}
    for g in draw(st.lists(st.integers(0, len(GPUS) - 1), max_size=1)):  # shares of a GPU
        gone, kept = share_key(GPUS[g], "job-1"), share_key(GPUS[g], "job-2")
        ended = T0_US + draw(st.integers(0, 8)) * INTERVAL_US
        timelines[GPUS[g]] = (
            *timelines.get(GPUS[g], ()),
            Holding(gone, OWNERS[0], T0_US - INTERVAL_US, to_us=ended, share=500),
            Holding(kept, OWNERS[1], T0_US + draw(st.integers(0, 4)) * INTERVAL_US, share=250),
        )
        since = T0_US - 5 * INTERVAL_US  # job-1's share: idle, its alert open
        idle[gone] = GpuIdleState(gone, T0_US - INTERVAL_US, OWNERS[0], since, None, since)
    known = draw(
        st.sampled_from([{}, {"job-1": OWNERS[1]}, {"job-1": OWNERS[0], "job-2": OWNERS[2]}])
    )
    cutoffs = {
        sample_scope(GPUS[g]): T0_US + draw(st.integers(1, 6)) * INTERVAL_US
        for g in draw(st.lists(st.integers(0, len(GPUS) - 1), max_size=1))
    }
    held = draw(st.booleans())
    holds = (
        {
            ("job-1", Unit.GPU_MS): OpenHold(
                "job-1", Unit.GPU_MS, "vision", "detection", 50_000, T0_US + 10**10, "hold-1"
            )
        }
        if held
        else {}
    )
    closed = frozenset({period_label(T0_US)}) if draw(st.booleans()) else frozenset()
    change = T0_US + draw(st.integers(0, 12)) * INTERVAL_US + draw(st.integers(0, 9_999_999))
    prices = PriceBook(
        (Price(H100, 3_200_000), Price(H100, 2_100_000, effective_us=change)),
        (EnergyPrice(150_000),) if draw(st.booleans()) else (),
    )
    centres = {"vision": "research"} if draw(st.booleans()) else {}
    view = LedgerView(
        seen=seen,
        closed=closed,
        timelines=timelines,
        idle=idle,
        holds=holds,
        forgotten_before=cutoffs,
        job_owners=known,
    )
    return messages, view, FoldRules(prices, centres, POLICY)


def _rows(folded: Folded) -> list[dict[str, Any]]:
    tables = [transactions_to_arrow(folded.transactions, "inc")]
    if folded.columns is not None:
        tables.append(columns_to_arrow(folded.columns, "inc"))
    return sorted(pa.concat_tables(tables).to_pylist(), key=lambda r: (r["txn_id"], r["leg"]))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches())
def test_the_column_path_books_exactly_what_the_per_sample_path_books(batch: Any) -> None:
    messages, view, rules = batch
    decoded, _ = decode_all(messages, decode_message)
    fast = fold_samples(decoded, view, rules, columnar=True)
    slow = fold_samples(decoded, view, rules, columnar=False)
    assert slow.columns is None
    assert _rows(fast) == _rows(slow)
    assert fast.dead == slow.dead
    assert fast.duplicates == slow.duplicates
    assert sorted(fast.idle_states, key=lambda s: s.subject) == sorted(
        slow.idle_states, key=lambda s: s.subject
    )
    assert fast.alerts == slow.alerts
    assert fast.changes == slow.changes


@pytest.mark.parametrize(
    ("holder", "columnar"),
    [
        pytest.param("sample", True, id="owner-named-by-the-sample"),
        pytest.param("process", True, id="one-owned-process"),
        pytest.param("unowned", True, id="unallocated"),
        pytest.param("shared", False, id="shared-gpu-goes-per-sample"),
    ],
)
def test_the_common_case_is_the_one_built_in_columns(holder: str, columnar: bool) -> None:
    """The property above would hold if nothing ever went columnar: pin down what does."""
    spec = {"gpu": 0, "step": 1, "mig": None, "holder": holder, "owner": 0, "util": 50,
            "energy": 5, "model": H100, "resend": False}  # fmt: skip
    envelope = envelope_for(_sample(spec), "sim://node-01")
    message = ConsumedMessage("samples", 0, 0, orjson.dumps([envelope_to_json(envelope)]))
    decoded, _ = decode_all([message], decode_message)
    rules = FoldRules(PriceBook((Price(H100, 3_200_000),)), {}, POLICY)
    folded = fold_samples(decoded, LedgerView(), rules)
    assert (folded.columns is not None) is columnar
    assert len(folded.transactions) == (0 if columnar else 1)


def envelope_to_json(envelope: Any) -> Any:
    return orjson.loads(encode_batch([envelope]))[0]
