"""The kubelet's read-only pods endpoint (`GET http://<node>:10255/pods`) as a cache of this
node's pods, by uid and by namespace/name (`KubeletPods`).

Rules:
- One GET with a connect/read timeout and a size limit; the answer is a v1 `PodList`
  (`collectors.k8s_identity.parse_pod_list`).
- The pods are re-read when the last read is `refresh_s` old. A uid the cache does not know
  (a pod started since) re-reads at most once per `miss_refresh_s`.
- An unreachable kubelet, an error status or an answer that is not a PodList is logged (once
  per run of failures) and changes nothing: the pods read before are kept, and the next read
  waits `refresh_s`. A pod never read stays unknown, so its owner stays `k8s-pod:<uid>`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import requests

from collectors.k8s_identity import Pod, parse_pod_list

log = logging.getLogger("tally.collector.kubelet")

Clock = Callable[[], float]


@dataclass(frozen=True, slots=True)
class PodIndex:
    """The pods of one kubelet answer, by uid and by (namespace, name)."""

    by_uid: Mapping[str, Pod] = field(default_factory=lambda: MappingProxyType({}))
    by_name: Mapping[tuple[str, str], Pod] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def of(cls, pods: tuple[Pod, ...]) -> PodIndex:
        return cls(
            MappingProxyType({pod.uid: pod for pod in pods}),
            MappingProxyType({(pod.namespace, pod.name): pod for pod in pods}),
        )


class KubeletPods:
    """This node's pods as its kubelet reports them, re-read every `refresh_s` seconds."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 2.0,
        refresh_s: float = 30.0,
        miss_refresh_s: float = 5.0,
        max_bytes: int = 32 << 20,
        session: requests.Session | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"kubelet url must be http:// or https://, got {url!r}")
        if timeout_s <= 0 or refresh_s <= 0 or miss_refresh_s < 0 or max_bytes < 1:
            raise ValueError("timeout_s, refresh_s and max_bytes must be positive")
        self.url = url
        self._timeout_s = timeout_s
        self._refresh_s = refresh_s
        self._miss_refresh_s = miss_refresh_s
        self._max_bytes = max_bytes
        self._session = session if session is not None else requests.Session()
        self._owns_session = session is None
        self._clock = clock
        self._index = PodIndex()
        self._read_at: float | None = None  # last attempt, successful or not
        self._failed_at: float | None = None
        self._failing = False

    def index(self) -> PodIndex:
        """The pods, re-read first when the last read is `refresh_s` old."""
        now = self._clock()
        if self._read_at is None or now - self._read_at >= self._refresh_s:
            self._read(now)
        return self._index

    def by_uid(self, uid: str) -> Pod | None:
        """The pod with this uid, re-reading once for a uid not seen yet (a new pod)."""
        pod = self.index().by_uid.get(uid)
        if pod is not None:
            return pod
        now = self._clock()
        recently_failed = self._failed_at is not None and now - self._failed_at < self._refresh_s
        stale = self._read_at is not None and now - self._read_at >= self._miss_refresh_s
        if stale and not recently_failed:
            self._read(now)
        return self._index.by_uid.get(uid)

    def _read(self, now: float) -> None:
        self._read_at = now
        try:
            pods = self._fetch()
        except (requests.RequestException, ValueError) as exc:
            self._failed_at = now
            if not self._failing:
                log.warning("kubelet %s: %s; pods stay as last read", self.url, exc)
            self._failing = True
            return
        if self._failing:
            log.info("kubelet %s answers again (%d pods)", self.url, len(pods))
        self._failing = False
        self._failed_at = None
        self._index = PodIndex.of(pods)

    def _fetch(self) -> tuple[Pod, ...]:
        timeout = (self._timeout_s, self._timeout_s)
        with self._session.get(self.url, timeout=timeout, stream=True) as response:
            if response.status_code != 200:
                raise ValueError(f"HTTP {response.status_code}")
            body = bytearray()
            for chunk in response.iter_content(65_536):
                body += chunk
                if len(body) > self._max_bytes:
                    raise ValueError(f"answer larger than {self._max_bytes} bytes")
        return parse_pod_list(bytes(body))

    def close(self) -> None:
        if self._owns_session:
            self._session.close()

    def __enter__(self) -> KubeletPods:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
