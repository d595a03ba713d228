"""dcgm-exporter parse rate: `parse_metrics` on a realistic 8-GPU payload, beside a plain
`prometheus_client` parse (full iteration of families and samples) of the same text."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from collectors.dcgm_parse import parse_metrics
from tests.benchmarks.harness import Figure, Progress

BENCH = "dcgm"
PAYLOAD = Path(__file__).resolve().parent.parent / "fixtures" / "dcgm" / "h100_8gpu_pods.txt"
SECONDS_PER_FIGURE = 3.0
T_US = 1_793_491_200_000_000


def _rate(work: Callable[[], object], seconds: float = SECONDS_PER_FIGURE) -> float:
    """Calls per second of `work`, measured over at least `seconds` after a short warm-up."""
    for _ in range(5):
        work()
    calls = 0
    started = time.perf_counter()
    elapsed = 0.0
    while elapsed < seconds:
        for _ in range(10):
            work()
        calls += 10
        elapsed = time.perf_counter() - started
    return calls / elapsed


def _parse(text: str) -> Callable[[], int]:
    def work() -> int:
        result = parse_metrics(
            text, host_default="bench", pool="h100", time_us=T_US, interval_us=30_000_000
        )
        return len(result.samples)

    return work


def _baseline(text: str) -> Callable[[], int]:
    def work() -> int:
        return sum(len(family.samples) for family in text_string_to_metric_families(text))

    return work


def run(progress: Progress) -> list[Figure]:
    text = PAYLOAD.read_text()
    samples = _parse(text)()
    rows = _baseline(text)()
    lines = len(text.splitlines())
    # The last row parse_metrics reads gets a label name the parser rejects: the whole block
    # is parsed in vain, then every line again on its own (the worst case of the fallback).
    head, _, tail = text.rpartition('DCGM_FI_PROF_DRAM_ACTIVE{gpu="7"')
    broken = head + 'DCGM_FI_PROF_DRAM_ACTIVE{bad label="x",gpu="7"' + tail
    check = parse_metrics(broken, host_default="b", pool="p", time_us=T_US, interval_us=1)
    assert len(check.problems) == 1, "the broken payload must take the per-line path"

    progress(f"prometheus_client baseline on {lines} lines, {rows} rows …")
    baseline = _rate(_baseline(text))
    progress("parse_metrics …")
    ours = _rate(_parse(text))
    progress("parse_metrics, per-line fallback …")
    fallback = _rate(_parse(broken))
    return [
        Figure(
            bench=BENCH,
            name="payload parse",
            value=ours,
            unit="payloads/s",
            baseline_name="prometheus_client full parse",
            baseline_value=baseline,
            target="≥ 1× baseline",
            note=f"8 × H100 with pod labels: {lines} lines, {rows} rows, {samples} GpuSamples",
        ),
        Figure(
            bench=BENCH,
            name="sample rate",
            value=ours * samples,
            unit="samples/s",
            note="GpuSamples out of parse_metrics per second",
        ),
        Figure(
            bench=BENCH,
            name="one bad line",
            value=fallback,
            unit="payloads/s",
            baseline_name="parse_metrics, clean payload",
            baseline_value=ours,
            note="the last row is rejected: block parse, then line by line",
        ),
    ]
