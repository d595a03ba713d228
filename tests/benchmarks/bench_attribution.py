"""Attribution throughput: GPU-intervals attributed per second by `attribute_sample`, for the
sample shapes a fleet produces (whole GPUs with one owner, unowned GPUs, GPUs shared by several
owners, MIG slices), beside decoding the same samples from the wire as the baseline — so the
ratio reads "attribution costs this many decodes"."""

from __future__ import annotations

import time

from ledger.attribution import attribute_sample
from ledger.events import decode_message, encode_batch, envelope_for
from ledger.pricing import Price, PriceBook
from tests.benchmarks.harness import Figure, Progress
from tests.builders import INTERVAL_US, T0_US, a_mig, a_process, a_sample, an_owner

SAMPLES = 40_000
PRICES = PriceBook((Price("*", 2_500_000), Price("*", 2_000_000, effective_us=T0_US + 10**12)))


def _shapes(i: int):  # type: ignore[no-untyped-def]
    owner = an_owner(f"team{i % 7}", f"p{i % 3}", f"u{i % 11}", f"job-{i % 101}")
    t = T0_US + (i + 1) * INTERVAL_US
    match i % 4:
        case 0:
            return a_sample(sample_time_us=t, processes=(a_process(owner=owner),))
        case 1:
            return a_sample(sample_time_us=t, processes=())
        case 2:
            return a_sample(
                sample_time_us=t,
                processes=(
                    a_process(sm=60, owner=owner),
                    a_process(pid=2, sm=20, owner=an_owner("other")),
                    a_process(pid=3, sm=20, owner=None),
                ),
            )
        case _:
            return a_sample(
                sample_time_us=t, mig=a_mig(gi=i % 7), processes=(a_process(owner=owner),)
            )


def run(progress: Progress) -> list[Figure]:
    envelopes = [envelope_for(_shapes(i), f"sim://n{i % 16}") for i in range(SAMPLES)]
    wire = encode_batch(envelopes)
    progress(f"{SAMPLES} samples, four shapes")
    best_attr = best_decode = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for envelope in envelopes:
            attribute_sample(envelope, PRICES, {"team1": "research"})
        best_attr = min(best_attr, time.perf_counter() - start)
        start = time.perf_counter()
        decoded, dead = decode_message(wire)
        best_decode = min(best_decode, time.perf_counter() - start)
        assert len(decoded) == SAMPLES and not dead
    return [
        Figure(
            "attribution",
            "attribute_sample",
            SAMPLES / best_attr,
            "intervals/s",
            "decode the same samples",
            SAMPLES / best_decode,
            note="pure attribution (owner shares, largest remainder, pricing) per sample",
        ),
    ]
