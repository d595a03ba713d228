"""One HTTP server per process for Prometheus and health checks: `/metrics`, `/healthz`,
`/readyz` on the same port (prometheus_client's threaded WSGI server, on a daemon thread).

`/healthz` and `/readyz` answer 200 when their `Verdict` (`tally.health`) holds, else 503, with
the verdict as a JSON body; a probe that raises answers 503 naming the exception (a health
check must never take the server down). Anything else goes to Prometheus' app (`/metrics`;
prometheus_client also answers `/` with the metrics). A process without probes serves
`/metrics` only.

`Heartbeat` is the event-loop tick `/healthz` looks at: `await heartbeat.run()` in a task of
the loop being watched.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIServer, make_server

import orjson
from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer, _SilentHandler

from tally.health import Verdict

StartResponse = Callable[[str, list[tuple[str, str]]], Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


@dataclass(frozen=True, slots=True)
class Probes:
    """What `/healthz` (`live`) and `/readyz` (`ready`) answer, decided at request time."""

    live: Callable[[], Verdict]
    ready: Callable[[], Verdict]


class Heartbeat:
    """The monotonic time its loop last ticked; `age()` is read from the server's threads."""

    def __init__(self, interval_s: float = 1.0, clock: Callable[[], float] = time.monotonic):
        self.interval_s = interval_s
        self.clock = clock
        self.started = clock()
        self.last: float | None = None

    def tick(self) -> None:
        self.last = self.clock()

    def age(self) -> float | None:
        last = self.last
        return None if last is None else max(0.0, self.clock() - last)

    def up(self) -> float:
        """Seconds since the heartbeat was made."""
        return max(0.0, self.clock() - self.started)

    async def run(self) -> None:
        """Tick every `interval_s` until cancelled."""
        while True:
            self.tick()
            await asyncio.sleep(self.interval_s)


def _answer(probe: Callable[[], Verdict], good: str, bad: str) -> tuple[str, bytes]:
    try:
        verdict = probe()
    except Exception as exc:  # a broken probe is an unhealthy process, not a dead server
        body: dict[str, Any] = {
            "status": bad,
            "checks": {"probe": {"ok": False, "detail": f"{type(exc).__name__}: {exc}"}},
        }
        return "503 Service Unavailable", orjson.dumps(body)
    status = "200 OK" if verdict.ok else "503 Service Unavailable"
    return status, orjson.dumps(verdict.body(good, bad))


def health_app(metrics_app: WsgiApp, probes: Probes | None) -> WsgiApp:
    """`metrics_app` with `/healthz` and `/readyz` in front of it."""
    routes: dict[str, tuple[Callable[[], Verdict], str, str]] = {}
    if probes is not None:
        routes = {
            "/healthz": (probes.live, "alive", "dead"),
            "/readyz": (probes.ready, "ready", "not_ready"),
        }

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        route = routes.get(environ.get("PATH_INFO", ""))
        if route is None:
            return metrics_app(environ, start_response)
        status, body = _answer(*route)
        start_response(
            status,
            [
                ("Content-Type", "application/json"),
                ("Content-Length", str(len(body))),
                ("Cache-Control", "no-store"),
            ],
        )
        return [] if environ.get("REQUEST_METHOD") == "HEAD" else [body]

    return app


def start_server(
    registry: CollectorRegistry, host: str, port: int, probes: Probes | None = None
) -> tuple[WSGIServer, threading.Thread]:
    """Serve `registry` at `/metrics` and `probes` at `/healthz`, `/readyz` on `host:port` from
    a daemon thread; port 0 picks a free port (`server.server_port`). Raises `OSError` (and
    `socket.gaierror`) when the address cannot be listened on."""

    class Server(ThreadingWSGIServer):
        """A class of its own: the address family is set per server."""

    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, _, _, sockaddr = infos[0]  # an IPv6 host needs an AF_INET6 server
    Server.address_family, addr = family, str(sockaddr[0])
    app = health_app(make_wsgi_app(registry), probes)
    httpd = make_server(addr, port, app, Server, handler_class=_SilentHandler)
    thread = threading.Thread(target=httpd.serve_forever, name="metrics-http", daemon=True)
    thread.start()
    return httpd, thread
