"""A TCP proxy whose network can be cut: the broker outage of the end-to-end tests.

tansu keeps nothing across a restart (memory storage), so a broker that is stopped and started
again is a new, empty broker. To take the broker away from its clients and give it back with
its topics, the clients reach it through `NetworkCut`, a proxy on 127.0.0.1 (the broker
advertises the proxy's port, `EmbeddedBroker(advertised_port=...)`). `cut()` aborts every open
connection and stops listening, so clients see a dead broker (resets, then refused
connections); `mend()` listens again on the same port. The broker itself runs throughout.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any

from tally.broker import free_port


class NetworkCut:
    """A TCP proxy 127.0.0.1:`port` → 127.0.0.1:`target_port`, on its own thread and loop."""

    def __init__(self, target_port: int, port: int | None = None) -> None:
        self.target_port = target_port
        self.port = port or free_port()
        self.connections = 0  # accepted while up
        self.cuts = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def up(self) -> bool:
        return self._server is not None

    def start(self) -> NetworkCut:
        self._thread.start()
        self._call(self._listen())
        return self

    def cut(self) -> None:
        """Drop every connection and stop listening."""
        self._call(self._cut())
        self.cuts += 1

    def mend(self) -> None:
        """Listen again on the same port."""
        self._call(self._listen())

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        self._call(self._cut())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def _call(self, coro: Coroutine[Any, Any, None]) -> None:
        asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    async def _listen(self) -> None:
        if self._server is None:
            self._server = await asyncio.start_server(
                self._accept, "127.0.0.1", self.port, reuse_address=True
            )

    async def _cut(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for writer in list(self._open):
            writer.transport.abort()
        self._open.clear()
        if server is not None:
            await server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._server is None:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()
            return
        self.connections += 1
        self._open.update((writer, up_writer))
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        self._open.difference_update((writer, up_writer))

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()
