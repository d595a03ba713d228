"""The scheduler's real API on a loopback port for clients that speak plain HTTP (the
dashboard's portal and Requests page, `dashboard.portal_api`): an aiohttp server over the
service on the fake executor (`tests.unit.test_scheduler_service_support.Rig`, jobs run until
cancelled), served from its own thread's event loop and ticked there. The static tokens are
`tests.unit.test_scheduler_api_support.TOKENS`; `oidc` adds a bearer-JWT verifier."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from pathlib import Path

from aiohttp import web

from scheduler.api import build_app
from scheduler.api.oidc import OidcVerifier
from scheduler.executors.fake import RUNS_FOREVER
from tests.unit.test_scheduler_api_support import MAX_BODY, TOKENS
from tests.unit.test_scheduler_service_support import Rig

TICK_S = 0.2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ApiServer:
    """The scheduler's API on a loopback port, served from its own thread's event loop, the
    service ticked there every TICK_S on a clock that follows the wall clock."""

    def __init__(self, tmp: Path, oidc: OidcVerifier | None = None) -> None:
        self.rig = Rig(tmp)
        self.rig.executor.default = RUNS_FOREVER
        self.rig.clock.now = time.time_ns() // 1000
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.loop = asyncio.new_event_loop()
        self.app = build_app(self.rig.service, TOKENS, MAX_BODY, 10.0, oidc)
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.runner = web.AppRunner(self.app)

    async def _ticks(self) -> None:
        while True:
            self.rig.clock.now = max(self.rig.clock.now, time.time_ns() // 1000)
            await self.rig.service.tick()
            await asyncio.sleep(TICK_S)

    async def _start(self) -> None:
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()
        self.ticking = asyncio.ensure_future(self._ticks())

    async def _stop(self) -> None:
        self.ticking.cancel()
        await self.runner.cleanup()

    def __enter__(self) -> ApiServer:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(30)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()
