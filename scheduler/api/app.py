"""The aiohttp application: the routes of the route table on the handlers, the access log and
the error middleware, and `api_server`, what `run_service` calls to serve it.

Access log (logger `tally.scheduler.access`, INFO): one line per request —
`METHOD PATH STATUS DURATIONms PRINCIPAL` — the path without its query string, the principal
`admin`, `team:<name>`, `<role>:oidc:<user>` (a person signed in through OIDC) or `-`; never a
token.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from scheduler.api.auth import PRINCIPAL_KEY, Tokens
from scheduler.api.handlers import DEFAULT_BODY_TIMEOUT_S, Api
from scheduler.api.oidc import OidcVerifier
from scheduler.api.openapi import document
from scheduler.api.responses import STATUS_OF, ApiError, error_response
from scheduler.api.routes import ROUTES
from scheduler.errors import Rejected
from scheduler.service import SchedulerService

log = logging.getLogger("tally.scheduler.api")
access = logging.getLogger("tally.scheduler.access")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
MAX_LOGGED_PATH = 256


def printable(text: str, limit: int = MAX_LOGGED_PATH) -> str:
    """`text` for a log line: control characters escaped, at most `limit` characters."""
    if len(text) <= limit and text.isprintable() and " " not in text:
        return text  # nothing to escape or cut (a path's usual case)
    shown = "".join(c if c.isprintable() and c != " " else f"\\x{ord(c):02x}" for c in text[:limit])
    return shown + ("…" if len(text) > limit else "")


@web.middleware
async def access_log(request: web.Request, handler: Handler) -> web.StreamResponse:
    started = time.perf_counter()
    status = 500
    try:
        response = await handler(request)
        status = response.status
        return response
    finally:
        access.info(
            "%s %s %d %.1fms %s",
            printable(request.method, 16),
            printable(request.path),
            status,
            (time.perf_counter() - started) * 1000,
            request.get(PRINCIPAL_KEY, "-"),
        )


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure becomes a JSON answer; nothing a client sends escapes as an exception."""
    try:
        return await handler(request)
    except ApiError as exc:
        return error_response(exc.status, exc.message, exc.code)
    except Rejected as exc:
        status, code = STATUS_OF[exc.kind]
        return error_response(status, str(exc), code)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        response = error_response(exc.status, exc.reason or "error")
        allow = exc.headers.get("Allow")
        if allow:
            response.headers["Allow"] = allow
        return response
    except Exception:
        log.exception("unexpected error answering %s %s", request.method, printable(request.path))
        return error_response(500, "internal error", "internal")


def build_app(
    service: SchedulerService,
    tokens: Tokens,
    max_body_bytes: int,
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
    oidc: OidcVerifier | None = None,
) -> web.Application:
    """The API on `service`: every route of the route table, and the OpenAPI document. With
    `oidc`, people's bearer JWTs are accepted beside the static tokens."""
    api = Api(service, tokens, max_body_bytes, body_timeout_s, document(ROUTES), oidc)
    app = web.Application(middlewares=[access_log, json_errors], client_max_size=max_body_bytes)
    for route in ROUTES:
        app.router.add_route(route.method, route.path, getattr(api, route.handler))
    return app


def api_server(
    tokens: Tokens,
    host: str,
    port: int,
    max_body_bytes: int,
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
    oidc: OidcVerifier | None = None,
) -> Callable[[SchedulerService], Awaitable[Callable[[], Awaitable[None]]]]:
    """What `run_service` calls to start the API: returns the closer."""

    async def serve(service: SchedulerService) -> Callable[[], Awaitable[None]]:
        app = build_app(service, tokens, max_body_bytes, body_timeout_s, oidc)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        log.info("scheduler API on http://%s:%d", host, port)
        return runner.cleanup

    return serve
