"""The dcgm-exporter collector: NVIDIA dcgm-exporter's `/metrics` as GPU samples and health events.

This module owns `DcgmCollector`, one exporter with the state that spans scrapes (previous
scrape time per GPU, energy counters, last XID per GPU), `EnergyTracker` and `ScrapeResult`.
The rest of the way from the exporter to a sample lives in:

    dcgm_http         DcgmConfig, make_session, fetch_metrics: the HTTP side (timeouts,
                      retries with backoff, basic auth, TLS); every failure a DcgmScrapeError
    dcgm_exposition   the Prometheus text format: lines worth parsing, parsed rows, problems
                      grouped per kind and family, problem_dead_letter
    dcgm_fields       families, units and conversion, label quirks: host, GPU index, MIG
                      profile, owner_from_labels
    dcgm_parse        parse_metrics: one payload as samples, XID health events and problems
                      (memory, utilisation, MIG scope and XID rules)

Rules this module guarantees (and the tests pin):
- Time: a scrape's time (from the collector's clock, after the response arrived) is every
  sample's `sample_time_us`; `interval_us` is the time since the previous scrape that saw the
  same GPU (slice), or the configured scrape interval on the first scrape, after a gap longer
  than `MAX_INTERVAL_US`, or when the clock went backwards. `energy_mj` is filled only when the
  interval is continuous with the previous reading.
- XID: each GPU's last XID value is kept between scrapes, so an XID health event is emitted
  once when the value changes (see `collectors.dcgm_parse`).
- Every dropped row of a payload becomes a dead letter (`problem_dead_letter`).
- Pods: a row's pod is named `k8s:<namespace>/<pod>`, the id the NVML collector gives the same
  pod; with a kubelet (`collectors.kubelet`) the pod's labels name its team and project too.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import requests

from collectors.dcgm_exposition import DcgmProblem, problem_dead_letter
from collectors.dcgm_fields import PodsByName
from collectors.dcgm_http import DcgmConfig, Sleep, fetch_metrics, make_session
from collectors.dcgm_parse import GpuActivity, parse_metrics
from collectors.inventory import NodeFacts
from collectors.kubelet import KubeletPods
from ledger.events import (
    MAX_INTERVAL_US,
    DeadLetter,
    GpuHealth,
    SampleEnvelope,
    envelope_for,
)

Clock = Callable[[], int]


# ---------------------------------------------------------------------------- energy


class EnergyTracker:
    """Cumulative energy counters (mJ) per GPU as energy used since the previous reading.

    A counter lower than its previous reading was reset (driver reload, GPU reset) and is taken
    to have counted from zero since, as Prometheus' `increase()` does. The first reading of a
    GPU, or the first after `forget`, gives None.
    """

    def __init__(self) -> None:
        self._last: dict[str, int] = {}

    def observe(self, key: str, counter_mj: int) -> int | None:
        previous = self._last.get(key)
        self._last[key] = counter_mj
        if previous is None:
            return None
        if counter_mj >= previous:
            return counter_mj - previous
        return counter_mj

    def forget(self, key: str) -> None:
        self._last.pop(key, None)


# ---------------------------------------------------------------------------- collector


@dataclass(frozen=True, slots=True)
class ScrapeResult:
    """One scrape: sample envelopes, XID health events, dead letters for dropped rows, and the
    problems and profiling ratios they came with."""

    envelopes: tuple[SampleEnvelope, ...]
    health: tuple[GpuHealth, ...]
    dead_letters: tuple[DeadLetter, ...]
    problems: tuple[DcgmProblem, ...] = ()
    activity: tuple[GpuActivity, ...] = ()
    nodes: Mapping[str, NodeFacts] = field(default_factory=dict)  # labels, driver per node


def _wall_clock_us() -> int:
    return time.time_ns() // 1_000


class DcgmCollector:
    """Scrapes one dcgm-exporter and keeps what spans scrapes: each GPU's previous scrape time,
    its energy counter and its last XID.

    The session is created here (`make_session`) unless one is passed in; a passed-in session
    is not closed by `close()`. `kubelet`, when given, is read (through its cache) before each
    scrape for the labels of the pods the rows name.
    """

    def __init__(
        self,
        config: DcgmConfig,
        *,
        session: requests.Session | None = None,
        clock: Clock = _wall_clock_us,
        sleep: Sleep = time.sleep,
        kubelet: KubeletPods | None = None,
    ) -> None:
        self.config = config
        self._kubelet = kubelet
        self._session = session if session is not None else make_session()
        self._owns_session = session is None
        self._clock = clock
        self._sleep = sleep
        self._host = config.node or socket.gethostname()
        self._last_time_us: dict[str, int] = {}
        self._energy = EnergyTracker()
        self._xid: dict[str, int] = {}
        self._health_state: dict[str, tuple[int, int]] = {}  # ECC DBE total, pages pending

    def scrape(self) -> ScrapeResult:
        """Read the exporter once; raises DcgmScrapeError when it cannot be read."""
        text = fetch_metrics(self._session, self.config, sleep=self._sleep)
        pods = self._kubelet.index().by_name if self._kubelet is not None else None
        return self.ingest(text, self._clock(), pods)

    def ingest(self, text: str, time_us: int, pods: PodsByName | None = None) -> ScrapeResult:
        """Turn one payload read at `time_us` into envelopes, updating the state across scrapes;
        `pods` are the kubelet's pods by (namespace, name), for their labels."""
        config = self.config
        parsed = parse_metrics(
            text,
            host_default=self._host,
            pool=config.pool,
            time_us=time_us,
            interval_us=config.scrape_interval_us,
            pod_rules=config.pod_rules,
            pods=pods,
            previous_xid=self._xid,
            previous_health=self._health_state,
            model_default=config.model_default,
        )
        counters = {reading.gpu_uuid: reading.counter_mj for reading in parsed.energy}
        envelopes: list[SampleEnvelope] = []
        for sample in parsed.samples:
            previous = self._last_time_us.get(sample.subject)
            self._last_time_us[sample.subject] = time_us
            interval = config.scrape_interval_us
            continuous = previous is not None and 0 < time_us - previous <= MAX_INTERVAL_US
            if continuous and previous is not None:
                interval = time_us - previous
            energy = None
            if sample.mig is None:
                counter = counters.get(sample.gpu_uuid)
                if not continuous or counter is None:
                    self._energy.forget(sample.gpu_uuid)
                if counter is not None:
                    energy = self._energy.observe(sample.gpu_uuid, counter)
            timed = replace(sample, interval_us=interval, energy_mj=energy)
            envelopes.append(envelope_for(timed, source=f"dcgm://{timed.node}"))
        self._xid.update(
            {s.gpu_uuid: s.xid_errors for s in parsed.samples if s.xid_errors is not None}
        )
        self._health_state.update(parsed.health_state)
        return ScrapeResult(
            envelopes=tuple(envelopes),
            health=parsed.health,
            dead_letters=tuple(problem_dead_letter(p) for p in parsed.problems),
            problems=parsed.problems,
            activity=parsed.activity,
            nodes=parsed.nodes,
        )

    def close(self) -> None:
        if self._owns_session:
            self._session.close()

    def __enter__(self) -> DcgmCollector:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
