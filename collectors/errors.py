"""The collectors' exception tree: every error a collector adapter raises to its caller is a
`CollectorError`.

    CollectorError
    ├── NvmlUnavailableError  NVML cannot be used here (no library, driver, GPU or permission);
    │                         also a RuntimeError. Raised by `NvmlCollector.start` only.
    ├── DcgmScrapeError       dcgm-exporter's `/metrics` could not be read (network, TLS, HTTP
    │                         status, oversized body), after the retries that could help
    ├── SpoolError            the spool directory cannot be used (not creatable or writable,
    │                         disk full, changed under the collector)
    └── ProducerError         the broker did not take what was sent, and no spool keeps it

Library errors are translated once per adapter, where the library is called: `requests`' in
`collectors.dcgm_http._attempt`, pynvml's in `collectors.nvml_device.classify` (raised only by
`NvmlCollector.start`; later per-GPU NVML errors are problems of the round, reported in
`RoundResult.problems`, never raised), aiokafka's as `collectors.kafka.BROKER_ERRORS` (raised by
`collectors.producer` as `ProducerError`), `OSError`s in the spool. The collector's `/metrics`
(served with its health routes by `tally.metrics.serve_metrics`) fails to bind as
`tally.metrics.MetricsPortError`.
Control flow inside an adapter (`dcgm_http._Retry`, `nvml_device.GpuLost`) stays inside it and
never reaches a caller. Invalid arguments are `ValueError`s, as in the standard library.
"""

from __future__ import annotations


class CollectorError(Exception):
    """Base class of every error a collector adapter raises."""


class NvmlUnavailableError(CollectorError, RuntimeError):
    """NVML cannot be used on this machine (no library, no driver, no GPU, no permission).

    Raised only by `NvmlCollector.start`; the message says what is wrong in words a person can
    act on, and `__cause__` is the original `pynvml.NVMLError`.
    """


class DcgmScrapeError(CollectorError):
    """The exporter's `/metrics` could not be read.

    The only exception `fetch_metrics` and `DcgmCollector.scrape` raise for the network or the
    exporter: connection refused or reset, timeouts and 5xx after all retries, TLS failures,
    4xx (401/403: credentials), oversized bodies. `status` is the last HTTP status if any.
    """

    def __init__(
        self, message: str, *, url: str, status: int | None = None, attempts: int = 1
    ) -> None:
        super().__init__(f"{url}: {message}")
        self.url = url
        self.status = status
        self.attempts = attempts


class SpoolError(CollectorError):
    """The spool directory cannot be used (not creatable, not writable, disk full)."""


class ProducerError(CollectorError):
    """The broker did not take what the producer sent (and there is no spool to keep it)."""
