"""``Gateway``: the gateway app served by uvicorn on a background thread."""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading
import time
from types import TracebackType

import uvicorn

from boltrl.gateway.app import create_gateway_app
from boltrl.gateway.backend import Backend
from boltrl.store.base import Store

log = logging.getLogger(__name__)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Gateway:
    """Serves a backend over OpenAI-compatible HTTP, recording rollout calls in ``store``.

    ``start()`` binds ``host:port`` (port 0 picks a free one), runs uvicorn on a daemon
    thread and returns once it accepts connections; ``stop()`` shuts it down and waits.
    Use it as a context manager to always stop it. Neither the backend nor the store is
    closed on stop: they belong to the caller.

    Binding anywhere but loopback requires ``token`` (sent by clients as their API key).
    """

    def __init__(
        self,
        backend: Backend,
        store: Store | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        log_level: str = "warning",
    ) -> None:
        if not _is_loopback(host) and not token:
            raise ValueError(
                f"host {host!r} is not loopback: pass token=... so the gateway is not open "
                "to anyone who can reach it"
            )
        self.backend = backend
        self.store = store
        self.host = host
        self.port = port
        self.token = token
        self.app = create_gateway_app(backend, store, token=token)
        self._log_level = log_level
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """``http://HOST:PORT`` of the running gateway (no trailing slash)."""
        if self._server is None:
            raise RuntimeError("the gateway is not started: call start() first")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def rollout_url(self, rollout_id: str) -> str:
        """The OpenAI ``base_url`` for one rollout's recorded calls."""
        return f"{self.url}/rollouts/{rollout_id}/v1"

    def start(self, timeout_s: float = 10.0) -> Gateway:
        """Start serving; returns when connections are accepted. Raises if it cannot."""
        if self._server is not None:
            return self
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        # proto must say TCP: asyncio sets TCP_NODELAY on accepted connections only then,
        # and without it every response waits ~40 ms on delayed ACKs.
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.port))
        except OSError:
            sock.close()
            raise
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app,
            log_level=self._log_level,
            access_log=False,
            lifespan="off",
            # httptools and uvloop when installed (uvicorn[standard]), else h11 and asyncio
            loop="auto",
            http="auto",
            timeout_graceful_shutdown=2,
        )
        server = uvicorn.Server(config)
        thread = threading.Thread(
            target=server.run, kwargs={"sockets": [sock]}, name="boltrl-gateway", daemon=True
        )
        self._server, self._thread = server, thread
        thread.start()
        deadline = time.monotonic() + timeout_s
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                self._server = self._thread = None
                sock.close()
                raise RuntimeError(f"the gateway did not start on {self.host}:{self.port}")
            time.sleep(0.005)
        log.info("boltrl gateway serving on %s", self.url)
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop serving and wait for the server thread. Idempotent."""
        server, thread = self._server, self._thread
        if server is None or thread is None:
            return
        server.should_exit = True
        thread.join(timeout_s)
        if thread.is_alive():
            server.force_exit = True
            thread.join(timeout_s)
        self._server = self._thread = None

    def __enter__(self) -> Gateway:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
