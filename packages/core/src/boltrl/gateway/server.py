"""``Gateway``: the gateway app served by uvicorn on a background thread."""

from __future__ import annotations

import logging
from collections.abc import Collection
from types import TracebackType

from boltrl._serving import MAX_BODY_BYTES, ServerThread, bind, check_exposure, local_hosts
from boltrl.gateway.app import create_gateway_app
from boltrl.gateway.backend import Backend
from boltrl.gateway.sessions import SessionConfig, Sweeper
from boltrl.records import Attempt
from boltrl.store._sessions import check_session_id
from boltrl.store.base import Store

log = logging.getLogger(__name__)


class Gateway:
    """Serves a backend over OpenAI-compatible HTTP, recording rollout calls in ``store``.

    ``start()`` binds ``host:port`` (port 0 picks a free one), runs uvicorn on a daemon
    thread and returns once it accepts connections; ``stop()`` shuts it down and waits.
    Use it as a context manager to always stop it. Neither the backend nor the store is
    closed on stop: they belong to the caller.

    Binding anywhere but loopback requires ``token`` (sent by clients as their API key):
    ``InvalidInput`` (a ``ValueError``) otherwise. Without a token only requests whose
    ``Host`` is loopback's or the bound address are served (a web page whose name was
    rebound to 127.0.0.1 is not); ``allowed_hosts`` replaces that list.

    ``sessions`` serves deployed agents' sessions too (``gateway.sessions``: the agent's
    base URL is ``session_url(id)``, feedback goes to ``POST /sessions/{id}/feedback``);
    while serving, a sweeper thread closes sessions past their feedback deadline every
    ``sessions.sweep_interval_s``.
    """

    def __init__(
        self,
        backend: Backend,
        store: Store | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        allowed_hosts: Collection[str] | None = None,
        max_body_bytes: int = MAX_BODY_BYTES,
        log_level: str = "warning",
        sessions: SessionConfig | None = None,
    ) -> None:
        check_exposure(host, token)
        if allowed_hosts is None and token is None:
            allowed_hosts = local_hosts(host)
        self.backend = backend
        self.store = store
        self.host = host
        self.port = port
        self.token = token
        self.sessions = sessions
        self.app = create_gateway_app(
            backend,
            store,
            token=token,
            allowed_hosts=allowed_hosts,
            max_body_bytes=max_body_bytes,
            sessions=sessions,
        )
        self._sweeper = (
            Sweeper(self.app.state.sessions_store, sessions.sweep_interval_s)
            if sessions is not None
            else None
        )
        self._log_level = log_level
        self._server: ServerThread | None = None

    @property
    def url(self) -> str:
        """``http://HOST:PORT`` of the running gateway (no trailing slash)."""
        if self._server is None:
            raise RuntimeError("the gateway is not started: call start() first")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def rollout_url(self, attempt: Attempt | str) -> str:
        """The OpenAI ``base_url`` for one attempt's recorded calls (``Attempt.route``);
        given a bare rollout id, the tokenless route, which records nothing."""
        if isinstance(attempt, Attempt):
            return f"{self.url}{attempt.route}/v1"
        return f"{self.url}/rollouts/{attempt}/v1"

    def session_url(self, session_id: str) -> str:
        """The OpenAI ``base_url`` of one session's recorded calls:
        ``{url}/sessions/{session_id}/v1`` (InvalidInput for a malformed id)."""
        return f"{self.url}/sessions/{check_session_id(session_id)}/v1"

    def start(self, timeout_s: float = 10.0) -> Gateway:
        """Start serving; returns when connections are accepted. Raises if it cannot."""
        if self._server is not None:
            return self
        sock = bind(self.host, self.port)
        self.port = sock.getsockname()[1]
        server = ServerThread(self.app, sock, name="boltrl-gateway", log_level=self._log_level)
        server.start(timeout_s)
        self._server = server
        if self._sweeper is not None:
            self._sweeper.start()
        log.info("boltrl gateway serving on %s", self.url)
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop serving and wait for the server thread. Idempotent."""
        server, self._server = self._server, None
        if self._sweeper is not None:
            self._sweeper.stop()
        if server is not None:
            server.stop(timeout_s)

    def __enter__(self) -> Gateway:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
