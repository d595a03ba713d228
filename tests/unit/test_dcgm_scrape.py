"""fetch_metrics and DcgmCollector against a real HTTP(S) server on 127.0.0.1."""

from __future__ import annotations

import base64
import shutil
import socket
import ssl
import subprocess
import threading
import time
import warnings
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests

from collectors.dcgm import DcgmCollector
from collectors.dcgm_http import DcgmConfig, fetch_metrics
from collectors.errors import DcgmScrapeError
from ledger.events import MAX_INTERVAL_US, HealthKind

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "dcgm"
PAYLOAD = (FIXTURES / "v3_hostname.txt").read_text()
GPU0 = "GPU-d3b6a5c2-90e1-4f0b-b7a4-2c8e9f1d0a11"


@dataclass(frozen=True, slots=True)
class Reply:
    status: int = 200
    body: str = PAYLOAD
    delay_s: float = 0.0
    headers: tuple[tuple[str, str], ...] = ()


@dataclass
class Exporter:
    """A scripted `/metrics` endpoint: it answers with `replies` in order, then `default`."""

    url: str = ""
    replies: deque[Reply] = field(default_factory=deque)
    default: Reply = Reply()
    requests: list[dict[str, str]] = field(default_factory=list)


def _handler(exporter: Exporter) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            exporter.requests.append(dict(self.headers))
            reply = exporter.replies.popleft() if exporter.replies else exporter.default
            time.sleep(reply.delay_s)
            body = reply.body.encode()
            try:
                self.send_response(reply.status)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                for name, value in reply.headers:
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeouts)
                pass

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


def _serve(exporter: Exporter, context: ssl.SSLContext | None = None) -> Iterator[Exporter]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(exporter))
    scheme = "http"
    if context is not None:
        server.socket = context.wrap_socket(server.socket, server_side=True)
        scheme = "https"
    exporter.url = f"{scheme}://127.0.0.1:{server.server_address[1]}/metrics"
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield exporter
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture
def exporter() -> Iterator[Exporter]:
    yield from _serve(Exporter())


class Sleeps:
    """A `sleep` that records the backoff instead of waiting."""

    def __init__(self) -> None:
        self.calls: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


def config(url: str, **overrides: object) -> DcgmConfig:
    options: dict[str, object] = {
        "connect_timeout_s": 1.0,
        "read_timeout_s": 2.0,
        "retries": 2,
        "backoff_s": 0.25,
    }
    options.update(overrides)
    return DcgmConfig(url=url, **options)  # type: ignore[arg-type]


def fetch(cfg: DcgmConfig, sleep: Sleeps | None = None) -> str:
    with requests.Session() as session:
        return fetch_metrics(session, cfg, sleep=sleep or Sleeps())


def test_success_returns_the_payload(exporter: Exporter) -> None:
    assert fetch(config(exporter.url)) == PAYLOAD
    assert exporter.requests[0]["Host"].startswith("127.0.0.1")


def test_retries_after_a_503_then_succeeds(exporter: Exporter) -> None:
    exporter.replies.append(Reply(status=503, body="busy"))
    sleeps = Sleeps()

    assert fetch(config(exporter.url), sleeps) == PAYLOAD
    assert len(exporter.requests) == 2
    assert sleeps.calls == [0.25]


def test_retry_after_is_honoured_up_to_the_cap(exporter: Exporter) -> None:
    exporter.replies.extend(
        [
            Reply(status=503, body="", headers=(("Retry-After", "3"),)),
            Reply(status=502, body="", headers=(("Retry-After", "60"),)),
        ]
    )
    sleeps = Sleeps()

    assert fetch(config(exporter.url, backoff_max_s=8.0), sleeps) == PAYLOAD
    assert sleeps.calls == [3.0, 8.0]


def test_5xx_after_all_retries_is_a_scrape_error(exporter: Exporter) -> None:
    exporter.default = Reply(status=500, body="dcgm hostengine down")
    sleeps = Sleeps()

    with pytest.raises(DcgmScrapeError) as caught:
        fetch(config(exporter.url, retries=3), sleeps)

    assert caught.value.status == 500
    assert caught.value.attempts == 4
    assert len(exporter.requests) == 4
    assert sleeps.calls == [0.25, 0.5, 1.0]  # exponential


def test_basic_auth_header_is_sent(exporter: Exporter) -> None:
    fetch(config(exporter.url, basic_auth=("tally", "s3cret")))

    expected = "Basic " + base64.b64encode(b"tally:s3cret").decode()
    assert exporter.requests[0]["Authorization"] == expected


def test_basic_auth_password_is_not_in_the_config_repr() -> None:
    assert "s3cret" not in repr(config("http://x/metrics", basic_auth=("tally", "s3cret")))


def test_401_is_a_clear_error_without_retry(exporter: Exporter) -> None:
    exporter.default = Reply(status=401, body="unauthorized")

    with pytest.raises(DcgmScrapeError, match="refused the credentials") as caught:
        fetch(config(exporter.url))

    assert caught.value.status == 401
    assert len(exporter.requests) == 1


def test_404_is_not_retried(exporter: Exporter) -> None:
    exporter.default = Reply(status=404, body="")

    with pytest.raises(DcgmScrapeError, match="HTTP 404"):
        fetch(config(exporter.url))

    assert len(exporter.requests) == 1


def test_read_timeout_is_retried_then_a_scrape_error(exporter: Exporter) -> None:
    exporter.default = Reply(delay_s=0.6)
    started = time.monotonic()

    with pytest.raises(DcgmScrapeError, match="ReadTimeout") as caught:
        fetch(config(exporter.url, read_timeout_s=0.2, retries=1))

    assert caught.value.attempts == 2
    assert time.monotonic() - started < 1.5


def test_connection_refused_is_a_scrape_error_after_retries() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    sleeps = Sleeps()

    with pytest.raises(DcgmScrapeError, match="after 3 attempts") as caught:
        fetch(config(f"http://127.0.0.1:{port}/metrics"), sleeps)

    assert caught.value.status is None
    assert isinstance(caught.value.__cause__, requests.ConnectionError)
    assert sleeps.calls == [0.25, 0.5]


def test_oversized_payload_is_refused(exporter: Exporter) -> None:
    with pytest.raises(DcgmScrapeError, match="larger than 1000 bytes"):
        fetch(config(exporter.url, max_bytes=1000))


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param({"url": "ftp://x"}, id="scheme"),
        pytest.param({"retries": -1}, id="retries"),
        pytest.param({"read_timeout_s": 0}, id="timeout"),
        pytest.param({"scrape_interval_us": MAX_INTERVAL_US + 1}, id="interval"),
        pytest.param({"pool": ""}, id="pool"),
        pytest.param({"basic_auth": ("tally", "pässwörd€")}, id="auth-not-latin-1"),
    ],
)
def test_config_rejects_nonsense(overrides: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        DcgmConfig(**{"url": "http://127.0.0.1/metrics", **overrides})  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- TLS


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
            "-addext", "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


@pytest.fixture
def tls_exporter(certificate: tuple[Path, Path]) -> Iterator[Exporter]:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*certificate)
    yield from _serve(Exporter(), context)


def test_tls_with_the_ca_bundle_verifies(
    tls_exporter: Exporter, certificate: tuple[Path, Path]
) -> None:
    assert fetch(config(tls_exporter.url, verify=str(certificate[0]))) == PAYLOAD


def test_tls_without_verification(tls_exporter: Exporter) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert fetch(config(tls_exporter.url, verify=False)) == PAYLOAD


def test_unreadable_ca_bundle_is_a_scrape_error(tls_exporter: Exporter, tmp_path: Path) -> None:
    with pytest.raises(DcgmScrapeError):
        fetch(config(tls_exporter.url, verify=str(tmp_path / "missing.pem")))


def test_tls_untrusted_certificate_is_not_retried(tls_exporter: Exporter) -> None:
    sleeps = Sleeps()

    with pytest.raises(DcgmScrapeError, match="TLS error") as caught:
        fetch(config(tls_exporter.url, verify=True), sleeps)

    assert caught.value.attempts == 1
    assert sleeps.calls == []


# ---------------------------------------------------------------------------- the collector


class Clock:
    def __init__(self, now_us: int) -> None:
        self.now_us = now_us

    def __call__(self) -> int:
        return self.now_us


T0 = 1_793_491_200_000_000


def test_collector_scrapes_into_envelopes(exporter: Exporter) -> None:
    clock = Clock(T0)
    cfg = config(exporter.url, pool="a100", scrape_interval_us=15_000_000)
    with DcgmCollector(cfg, clock=clock, sleep=Sleeps()) as collector:
        first = collector.scrape()
        exporter.default = Reply(body=PAYLOAD.replace("98765432101", "98765932101"))
        clock.now_us += 14_000_000
        second = collector.scrape()

    assert [e.source for e in first.envelopes] == ["dcgm://gpu-node-07"] * 2
    assert [e.data.interval_us for e in first.envelopes] == [15_000_000] * 2
    assert [e.data.energy_mj for e in first.envelopes] == [None, None]
    gpu0 = second.envelopes[0].data
    assert (gpu0.gpu_uuid, gpu0.pool, gpu0.sample_time_us) == (GPU0, "a100", T0 + 14_000_000)
    assert gpu0.interval_us == 14_000_000
    assert gpu0.energy_mj == 500_000
    assert second.envelopes[1].data.energy_mj == 0
    assert first.dead_letters == second.dead_letters == ()
    assert "text/plain" in exporter.requests[0]["Accept"]


def collector(**overrides: object) -> DcgmCollector:
    cfg = config("http://127.0.0.1:9/metrics", scrape_interval_us=30_000_000, **overrides)
    return DcgmCollector(cfg, session=requests.Session())


def test_interval_is_per_gpu_and_falls_back_after_gaps_and_clock_steps() -> None:
    c = collector()
    times = [T0, T0 + 10_000_000, T0 + 10_000_000 + MAX_INTERVAL_US + 1, T0]

    intervals = [c.ingest(PAYLOAD, t).envelopes[0].data.interval_us for t in times]

    assert intervals == [30_000_000, 10_000_000, 30_000_000, 30_000_000]


def test_energy_is_dropped_when_the_interval_is_not_continuous() -> None:
    c = collector()
    bumped = PAYLOAD.replace("98765432101", "98765433101")

    c.ingest(PAYLOAD, T0)
    gap = c.ingest(bumped, T0 + MAX_INTERVAL_US + 1).envelopes[0].data
    after = c.ingest(PAYLOAD.replace("98765432101", "98765434101"), T0 + MAX_INTERVAL_US + 2)

    assert gap.energy_mj is None
    assert after.envelopes[0].data.energy_mj == 1_000


def test_energy_counter_reset_counts_from_zero() -> None:
    c = collector()

    c.ingest(PAYLOAD, T0)
    reset = c.ingest(PAYLOAD.replace("98765432101", "4200"), T0 + 30_000_000)

    assert reset.envelopes[0].data.energy_mj == 4_200


def test_mig_slices_get_their_own_intervals_and_no_energy() -> None:
    c = collector()
    mig = (FIXTURES / "mig_a100.txt").read_text()

    c.ingest(mig, T0)
    second = c.ingest(mig, T0 + 20_000_000)

    by_subject = {e.subject: e.data for e in second.envelopes}
    slice_ = by_subject["GPU-b7c8d9e0-1f2a-4b3c-9d4e-5f6a7b8c9d01/gi1"]
    assert (slice_.interval_us, slice_.energy_mj) == (20_000_000, None)
    assert by_subject["GPU-b7c8d9e0-1f2a-4b3c-9d4e-5f6a7b8c9d02"].energy_mj == 0
    assert len({e.id for e in second.envelopes}) == 5


def test_xid_health_fires_once_per_new_error() -> None:
    c = collector()
    v4 = (FIXTURES / "v4_lowercase_hostname.txt").read_text()

    kinds = [
        [h.kind for h in c.ingest(text, T0 + i * 30_000_000).health]
        for i, text in enumerate([v4, v4, v4.replace("} 79\n", "} 0\n"), v4])
    ]

    assert kinds == [[HealthKind.XID_ERROR], [], [], [HealthKind.XID_ERROR]]


def test_problems_come_back_as_dead_letters() -> None:
    result = collector().ingest((FIXTURES / "xid_not_a_number.txt").read_text(), T0)

    (letter,) = result.dead_letters
    assert letter.reason.startswith("dcgm not_a_number DCGM_FI_DEV_XID_ERRORS")
    assert letter.payload.count("ERROR - FAILED TO CONVERT TO STRING") == 2
    assert len(result.envelopes) == 2


def test_rows_without_host_label_use_the_configured_node() -> None:
    result = collector(node="rack7-n3").ingest((FIXTURES / "v1_names.txt").read_text(), T0)

    assert {e.source for e in result.envelopes} == {"dcgm://rack7-n3"}
