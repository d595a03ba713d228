"""Reading dcgm-exporter's `/metrics` over HTTP: `DcgmConfig` (one endpoint and how to read it),
`make_session` and `fetch_metrics`.

`fetch_metrics` applies connect/read timeouts, retries with exponential backoff on connection
errors, timeouts and 5xx (honouring `Retry-After` up to the cap), basic auth, TLS verification
and a size limit. Every failure leaves it as one `DcgmScrapeError`; `_attempt` is the only
place that handles `requests`' exceptions, and `_Retry` (an attempt another may fix) never
leaves this module.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import requests

from collectors.dcgm_fields import MAX_LABEL_CHARS
from collectors.errors import DcgmScrapeError
from collectors.k8s_identity import PodRules
from ledger.events import MAX_INTERVAL_US

Sleep = Callable[[float], None]


@dataclass(frozen=True, slots=True)
class DcgmConfig:
    """One dcgm-exporter endpoint and how to read it.

    `verify` is True (system CAs), False (no verification) or the path of a CA bundle.
    `node` is the node name for rows without a host label (default: this machine's hostname).
    `pod_rules` name a pod's team and project (`collectors.k8s_identity`).
    """

    url: str
    pool: str = "default"
    node: str | None = None
    scrape_interval_us: int = 30_000_000  # dcgm-exporter's default collection interval
    connect_timeout_s: float = 3.05
    read_timeout_s: float = 10.0
    retries: int = 3
    backoff_s: float = 0.5
    backoff_max_s: float = 8.0
    basic_auth: tuple[str, str] | None = field(default=None, repr=False)
    verify: bool | str = True
    max_bytes: int = 32 << 20
    pod_rules: PodRules = field(default_factory=PodRules)
    model_default: str = "unknown"

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url must be http:// or https://, got {self.url!r}")
        if not 1 <= self.scrape_interval_us <= MAX_INTERVAL_US:
            raise ValueError("scrape_interval_us must be in [1, MAX_INTERVAL_US]")
        if self.connect_timeout_s <= 0 or self.read_timeout_s <= 0:
            raise ValueError("timeouts must be positive")
        if self.retries < 0 or self.backoff_s < 0 or self.backoff_max_s < 0:
            raise ValueError("retries and backoff must not be negative")
        if not self.pool or len(self.pool) > MAX_LABEL_CHARS:
            raise ValueError("pool must be a non-empty name of at most 256 characters")
        if self.max_bytes < 1:
            raise ValueError("max_bytes must be positive")
        if self.basic_auth is not None:
            try:
                ":".join(self.basic_auth).encode("latin-1")
            except UnicodeEncodeError as exc:
                raise ValueError("basic_auth must be latin-1 text (HTTP basic auth)") from exc


def make_session() -> requests.Session:
    """The HTTP session `DcgmCollector` creates when none is passed in."""
    session = requests.Session()
    session.headers["Accept"] = "text/plain;version=0.0.4;q=1,*/*;q=0.1"
    session.headers["User-Agent"] = "tally-dcgm-collector"
    return session


class _Retry(Exception):
    """One attempt failed in a way another attempt may fix."""

    def __init__(self, message: str, status: int | None, wait_s: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.wait_s = wait_s


def _retry_after(response: requests.Response) -> float | None:
    value = response.headers.get("Retry-After", "")
    return float(value) if value.isascii() and value.isdigit() else None


def _attempt(session: requests.Session, config: DcgmConfig) -> str:
    """One GET. Raises `_Retry` for what a retry may fix, DcgmScrapeError for the rest; the only
    place that handles requests' exceptions."""
    url = config.url
    try:
        with session.get(
            url,
            timeout=(config.connect_timeout_s, config.read_timeout_s),
            auth=config.basic_auth,
            verify=config.verify,
            stream=True,
        ) as response:
            status = response.status_code
            if status >= 500:
                raise _Retry(f"HTTP {status} {response.reason}", status, _retry_after(response))
            if status in (401, 403):
                raise DcgmScrapeError(
                    f"HTTP {status}: the exporter refused the credentials"
                    + ("" if config.basic_auth else " (no basic auth configured)"),
                    url=url,
                    status=status,
                )
            if not 200 <= status < 300:
                raise DcgmScrapeError(f"HTTP {status} {response.reason}", url=url, status=status)
            body = bytearray()
            for chunk in response.iter_content(chunk_size=1 << 16):
                body += chunk
                if len(body) > config.max_bytes:
                    raise DcgmScrapeError(
                        f"the response is larger than {config.max_bytes} bytes",
                        url=url,
                        status=status,
                    )
            return body.decode("utf-8", errors="replace")
    except requests.exceptions.SSLError as exc:  # a certificate does not fix itself on retry
        raise DcgmScrapeError(f"TLS error: {exc}", url=url) from exc
    except (
        requests.exceptions.ConnectionError,
        requests.exceptions.Timeout,
        requests.exceptions.ChunkedEncodingError,
    ) as exc:
        raise _Retry(f"{type(exc).__name__}: {exc}", None) from exc
    except requests.RequestException as exc:
        raise DcgmScrapeError(f"{type(exc).__name__}: {exc}", url=url) from exc
    except OSError as exc:  # requests raises a bare OSError for a CA bundle path it cannot read
        raise DcgmScrapeError(f"{type(exc).__name__}: {exc}", url=url) from exc


def fetch_metrics(
    session: requests.Session, config: DcgmConfig, *, sleep: Sleep = time.sleep
) -> str:
    """The exporter's payload as text; raises DcgmScrapeError.

    Connection errors, timeouts and 5xx are retried `config.retries` times, waiting
    `backoff_s × 2^(n-1)` (at most `backoff_max_s`, or a 5xx's `Retry-After` up to that cap)
    before the n-th retry. 4xx and TLS errors are not retried.
    """
    attempts = config.retries + 1
    for attempt in range(1, attempts + 1):
        try:
            return _attempt(session, config)
        except _Retry as failure:
            if attempt == attempts:
                raise DcgmScrapeError(
                    f"{failure} (after {attempts} attempts)",
                    url=config.url,
                    status=failure.status,
                    attempts=attempts,
                ) from failure.__cause__
            wait = config.backoff_s * 2 ** (attempt - 1)
            if failure.wait_s is not None:
                wait = max(wait, failure.wait_s)
            sleep(min(wait, config.backoff_max_s))
    raise AssertionError("unreachable: the loop returns or raises")
