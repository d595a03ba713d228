"""Inventory reports from what a collector sampled: one `InventoryReport` per node, sent when
the collector starts, whenever what it sees of a node changes, and every `every_rounds`
sampling intervals otherwise (so the ledger can tell a silent node from a quiet one).

The report of a node is built from the round's samples, whatever the source (NVML,
dcgm-exporter, the simulated fleet): each GPU once, by UUID, with its index, model and memory;
a GPU sampled per MIG instance is `mig_mode` with those instances (its memory is the sum of its
instances' memory: what can be handed out; the collectors' `unconfigured` pseudo-instance of
free slices is not an instance and is left out). A GPU that answered nothing this round (lost, not
scraped) is left out of the report, so it goes stale in the inventory. The pool is the
samples'; labels are the collector's (`--label`, `inventory.labels`) over the source's
(dcgm-exporter's labels common to a node's rows, `collectors.dcgm_nodes`); driver and CUDA
versions come from NVML, the driver version from dcgm-exporter's `DCGM_FI_DRIVER_VERSION`.
Each GPU's topology (`ledger.topology`) is what NVML discovered of it (`NodeFacts.topology`,
`collectors.nvml_topology`) under the node's `topology.*` labels, under the collector's per-GPU
labels (`inventory.gpu_labels`, by GPU index or UUID).

`InventoryReporter.after_round` decides and sends; a report is a message keyed by node for the
`inventory-reports` topic, buffered in the producer with the round's samples (and spooled with
them while the broker is away). Time is passed in (`clock`): report times are wall-clock
times, so staleness is judged against the clock whatever speed a simulation runs at.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ledger.attribution import UNCONFIGURED_PROFILE
from ledger.events import GpuSample
from ledger.inventory import InventoryReport, ReportedGpu, encode_report
from ledger.topology import NO_TOPOLOGY, GpuTopology, from_labels

Sender = Callable[[bytes, bytes], object]


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What a source says about a node besides its GPUs (dcgm-exporter: its labels and driver
    version, `collectors.dcgm_nodes`; NVML: each GPU's topology, by UUID)."""

    labels: tuple[tuple[str, str], ...] = ()
    driver_version: str | None = None
    topology: tuple[tuple[str, GpuTopology], ...] = ()


MIN_REPORT_INTERVAL_US = 1_000_000  # a fast simulation still reports at most once a second


def _wall_clock_us() -> int:
    return time.time_ns() // 1_000


def reports_from_samples(
    samples: Sequence[GpuSample],
    time_us: int,
    interval_us: int,
    labels: Mapping[str, str] | None = None,
    versions: tuple[str | None, str | None] = (None, None),
) -> list[InventoryReport]:
    """One report per node of `samples`, its GPUs in index order (pure)."""
    nodes: dict[str, dict[str, list[GpuSample]]] = {}
    for sample in samples:
        nodes.setdefault(sample.node, {}).setdefault(sample.gpu_uuid, []).append(sample)
    reports = []
    for node, gpus in nodes.items():
        reported = []
        for uuid, parts in gpus.items():
            first = parts[0]
            instances = [s for s in parts if s.mig is not None]
            real = [s for s in instances if s.mig and s.mig.profile != UNCONFIGURED_PROFILE]
            slices = tuple(
                sorted(
                    # the accounting layout is the samples', not the GPU's inventory
                    (replace(s.mig, first_slice=None) for s in real if s.mig is not None),
                    key=lambda m: (m.gpu_instance_id, m.compute_instance_id),
                )
            )
            memory = (
                sum(s.memory_total_bytes for s in real) if instances else first.memory_total_bytes
            )
            reported.append(
                ReportedGpu(uuid, first.gpu_index, first.model, memory, bool(instances), slices)
            )
        reported.sort(key=lambda g: (g.index, g.uuid))
        first_sample = next(iter(gpus.values()))[0]
        reports.append(
            InventoryReport(
                node=node,
                pool=first_sample.pool,
                source=first_sample.source,
                time_us=time_us,
                interval_us=interval_us,
                gpus=tuple(reported),
                labels=tuple(sorted((labels or {}).items())),
                driver_version=versions[0],
                cuda_version=versions[1],
            )
        )
    return reports


def _content(report: InventoryReport) -> InventoryReport:
    """What a report says apart from when: a change of it is sent at once."""
    return replace(report, time_us=0)


class InventoryReporter:
    """Sends each node's report when it is due: first seen, changed, or `every_rounds`
    intervals (wall clock) after the node's previous report."""

    def __init__(
        self,
        send: Sender,
        every_rounds: int,
        labels: Mapping[str, str] | None = None,
        versions: tuple[str | None, str | None] = (None, None),
        clock: Callable[[], int] = _wall_clock_us,
        node_facts: Mapping[str, NodeFacts] | None = None,
        gpu_labels: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        if every_rounds < 1:
            raise ValueError("every_rounds must be at least 1")
        self.send = send
        self.every_rounds = every_rounds
        self.labels = dict(labels or {})
        self.versions = versions
        self.clock = clock
        self.node_facts = node_facts if node_facts is not None else {}  # read at each round
        self.gpu_labels = {k: dict(v) for k, v in (gpu_labels or {}).items()}
        self._sent: dict[str, tuple[InventoryReport, int]] = {}  # node → (content, sent at)
        self.reports_sent = 0

    def after_round(
        self, samples: Sequence[GpuSample], interval_us: int, periodic: bool = True
    ) -> int:
        """Send the reports due after a round whose samples are `samples`; how many were sent.
        `interval_us`: the sampling interval in wall-clock time; `periodic=False` sends only
        first and changed reports (a backfill racing through history)."""
        now = self.clock()
        interval = max(interval_us, MIN_REPORT_INTERVAL_US)
        sent = 0
        built = reports_from_samples(samples, now, interval, self.labels, self.versions)
        for report in map(self._with_facts, built):
            content = _content(report)
            previous = self._sent.get(report.node)
            due = (
                previous is None
                or previous[0] != content
                or (periodic and now - previous[1] >= self.every_rounds * interval)
            )
            if due:
                self.send(report.node.encode(), encode_report(report))
                self._sent[report.node] = (content, now)
                sent += 1
        self.reports_sent += sent
        return sent

    def _with_facts(self, report: InventoryReport) -> InventoryReport:
        """The source's labels and driver version of the node, under the collector's own
        labels (which win) and versions; each GPU's topology."""
        facts = self.node_facts.get(report.node)
        if facts is not None:
            labels = dict(facts.labels) | self.labels
            report = replace(
                report,
                labels=tuple(sorted(labels.items()))[:64],
                driver_version=report.driver_version or facts.driver_version,
            )
        discovered = dict(facts.topology) if facts is not None else {}
        gpus = tuple(
            replace(
                gpu,
                topology=from_labels(
                    discovered.get(gpu.uuid, NO_TOPOLOGY),
                    report.labels,
                    self.gpu_labels.get(str(gpu.index), {}),
                    self.gpu_labels.get(gpu.uuid, {}),
                ),
            )
            for gpu in report.gpus
        )
        return replace(report, gpus=gpus)


def nvml_versions(nvml: Any) -> tuple[str | None, str | None]:
    """The driver and CUDA driver versions NVML reports ("550.54.15", "12.4"), None where it
    does not answer."""
    driver: str | None = None
    cuda: str | None = None
    try:
        raw = nvml.nvmlSystemGetDriverVersion()
        driver = raw.decode() if isinstance(raw, bytes) else str(raw)
    except Exception:  # best effort: the inventory does without
        driver = None
    try:
        version = int(nvml.nvmlSystemGetCudaDriverVersion())
        cuda = f"{version // 1000}.{version % 1000 // 10}"
    except Exception:  # best effort
        cuda = None
    return driver, cuda
