"""Builders shared by the scheduler API tests (no tests here): tokens, a valid submission body,
and `Api`, a real aiohttp server on a `Rig` (the service on the fake executor and an in-memory
publisher) with a synchronous client."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from aiohttp.test_utils import TestClient, TestServer

from ledger.roles import Caller, Role
from scheduler.api import Tokens, build_app
from scheduler.api.oidc import OidcVerifier
from tests.unit.test_scheduler_service_support import Rig

ADMIN = "admin-token-0123456789abcdef"
VISION = "vision-token-0123456789abcdef"
LANGUAGE = "language-token-0123456789abcdef"
VIEWER = "viewer-token-0123456789abcdef"
MEMBER = "member-ada-token-0123456789abcdef"  # vision's member ada
TOKENS = Tokens(
    admin=ADMIN,
    teams={"vision": VISION, "language": LANGUAGE},
    named={
        VIEWER: Caller(Role.VIEWER, label="dashboards"),
        MEMBER: Caller(Role.MEMBER, "vision", "ada", "ada"),
    },
)
MAX_BODY = 4096


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def a_job(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "project": "detection",
        "user": "ada",
        "queue": "dev",
        "gpus": 1,
        "command": ["sleep", "60"],
    }
    body.update(overrides)
    return body


class Api:
    """A running API server in its own event loop, with a synchronous client."""

    def __init__(
        self,
        rig: Rig,
        body_timeout_s: float = 10.0,
        tokens: Tokens = TOKENS,
        oidc: OidcVerifier | None = None,
    ) -> None:
        self.rig = rig
        self.headers: dict[str, str] = {}  # of the last answer
        self.seen: list[tuple[str, str, int, Any]] = []  # (method, path, status, body) answered
        self.loop = asyncio.new_event_loop()
        app = build_app(rig.service, tokens, MAX_BODY, body_timeout_s, oidc)
        self.server = TestServer(app, loop=self.loop)
        self.client = TestClient(self.server, loop=self.loop)
        self.loop.run_until_complete(self.client.start_server())

    def call(
        self,
        method: str,
        path: str,
        token: str | None = None,
        json: Any = None,
        data: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        async def go() -> tuple[int, Any]:
            sent = dict(headers or {})
            if token is not None:
                sent.update(auth(token))
            body = data if json is None else orjson.dumps(json)
            if body is not None:
                sent.setdefault("Content-Type", "application/json")
            async with self.client.request(method, path, data=body, headers=sent) as response:
                raw = await response.read()
                self.headers = dict(response.headers)
                try:
                    payload = orjson.loads(raw) if raw else None
                except orjson.JSONDecodeError:
                    payload = raw
                self.seen.append((method, response.url.path, response.status, payload))
                return response.status, payload

        return self.loop.run_until_complete(go())

    def submit(self, token: str, **overrides: Any) -> str:
        status, body = self.call("POST", "/v1/jobs", token, json=a_job(**overrides))
        assert status == 201, body
        return str(body["job"]["job_id"])

    def tick(self) -> None:
        self.loop.run_until_complete(self.rig.service.tick())
        self.rig.clock.advance(1_000_000)

    def close(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.run_until_complete(self.client.close())
        self.loop.close()
