"""Serving HTTP, written once for the store server, the gateway and the dashboard.

- ``check_exposure``: refuse to bind beyond loopback without a token.
- ``bind``: the listening socket (TCP_NODELAY-ready, port 0 picks a free one).
- ``Guard``: the ASGI middleware in front of every boltrl app: a Host allow-list
  (DNS rebinding), the bearer token (constant-time comparison), and, where asked, a
  JSON content type on state-changing requests and a cap on body size.
- ``ServerThread`` / ``serve_forever``: uvicorn on a background thread or in the
  foreground, from a socket ``bind`` made.

Each app renders a refusal in its own error shape (OpenAI's for the gateway, boltrl's
``{"error": {"code", "message"}}`` for the store and dashboard) through ``reject``.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Collection
from http.cookies import SimpleCookie
from typing import TYPE_CHECKING, Any

from boltrl.errors import BoltrlError, InvalidInput, Unauthorized

if TYPE_CHECKING:  # the error classes are imported by clients, which need no server
    import uvicorn
    from starlette.responses import Response
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger(__name__)

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
"""Host names a loopback server answers to when no other names are allowed."""

MAX_BODY_BYTES = 64 * 2**20
"""Default cap on a request body for the store server and the gateway (413 beyond it);
each takes ``max_body_bytes`` (the CLIs ``--max-body-mb``) to change it."""


class BadHost(InvalidInput):
    """The request's ``Host`` header is not one this server answers to."""

    code = "bad_host"


class UnsupportedMediaType(InvalidInput):
    """A state-changing request whose body is not declared as JSON."""

    status_code = 415
    code = "unsupported_media_type"


class PayloadTooLarge(InvalidInput):
    """The request body is larger than the server accepts."""

    status_code = 413
    code = "payload_too_large"


SERVING_ERRORS: tuple[type[BoltrlError], ...] = (BadHost, UnsupportedMediaType, PayloadTooLarge)
"""Errors ``Guard`` answers with, for clients mapping an error code back to a class."""


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) is this machine's loopback."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_token(name: str, token: str | None) -> str | None:
    """``token`` unless it is empty or blank (``InvalidInput`` naming ``name``): an empty
    token must never quietly mean "no authentication"."""
    if token is not None and (not isinstance(token, str) or not token.strip()):
        raise InvalidInput(
            f"{name}: an empty token is not a token; pass a non-empty one, or none to serve "
            "without (loopback only)"
        )
    return token


STORE_TOKEN_ENV = ("BOLTRL_STORE_TOKEN", "BOLTRL_TOKEN")
"""Where CLIs that name a remote store find its token by default, in this order
(``BOLTRL_TOKEN`` is also what ``boltrl store serve`` reads for its own)."""


def env_token() -> str | None:
    """The store token from the environment (``STORE_TOKEN_ENV``), or None."""
    for name in STORE_TOKEN_ENV:
        value = os.environ.get(name)
        if value is not None:
            return value
    return None


def check_exposure(host: str, token: str | None, name: str = "token") -> None:
    """Refuse an empty token, and to serve beyond loopback without a token: anyone who
    can reach the address could drive the server. Raises ``InvalidInput``."""
    check_token(name, token)
    if token is None and not is_loopback(host):
        raise InvalidInput(
            f"host: refusing to serve on {host!r} without a token; pass a token (--token), "
            "or bind 127.0.0.1"
        )


def local_hosts(host: str) -> list[str]:
    """The Host names a server bound to ``host`` answers to without a token: loopback's
    names and the bound address itself."""
    return [*LOOPBACK_NAMES, host.strip("[]").lower()]


def bind(host: str, port: int, backlog: int = 2048) -> socket.socket:
    """A listening socket (``port=0`` picks a free one: read it with ``url_of``)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto must say TCP: asyncio sets TCP_NODELAY only on sockets that do, and without
    # it every response waits ~40 ms (Nagle + delayed ACK between headers and body).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket) -> str:
    """``http://HOST:PORT`` of a bound socket (IPv6 in brackets)."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def token_matches(given: str, token: str) -> bool:
    """Constant-time comparison, so response timing does not leak the token's prefix."""
    return hmac.compare_digest(given.encode(), token.encode())


def _everything(path: str) -> bool:
    return True


_STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class Guard:
    """ASGI middleware checking each HTTP request before the app sees it.

    In order: the ``Host`` header is one of ``allowed_hosts`` (None: any; ports are
    ignored) → 400; with ``token``, a path that ``protected`` selects carries
    ``Authorization: Bearer <token>`` (or the ``cookie`` of that name) → 401; with
    ``json_only``, a state-changing request declares ``Content-Type: application/json``
    (a web page's cross-site "simple" POST cannot) → 415; with ``max_body_bytes``, the
    body is no larger (by ``Content-Length`` up front, else as it streams in) → 413.
    Refusals are rendered by ``reject`` in the app's own error shape; nothing of a
    refused request reaches the app. Non-HTTP scopes (lifespan) pass through.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        reject: Callable[[BoltrlError], Response],
        token: str | None = None,
        token_hint: str = "send 'Authorization: Bearer <token>'",
        cookie: str | None = None,
        protected: Callable[[str], bool] = _everything,
        allowed_hosts: Collection[str] | None = None,
        json_only: bool = False,
        max_body_bytes: int | None = None,
    ) -> None:
        self.app = app
        self._reject = reject
        self._token = check_token("token", token)
        self._hint = token_hint
        self._cookie = cookie
        self._protected = protected
        self._hosts = None if allowed_hosts is None else {h.lower() for h in allowed_hosts}
        self._json_only = json_only
        self._max_body = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            self._check(scope)
        except BoltrlError as e:
            await self._reject(e)(scope, receive, send)
            return
        if self._max_body is not None and scope["method"] in _STATE_CHANGING:
            receive = self._capped(receive)
        try:
            await self.app(scope, receive, send)
        except PayloadTooLarge as e:  # a body without Content-Length grew past the cap
            await self._reject(e)(scope, receive, send)

    def _check(self, scope: Scope) -> None:
        headers = _headers(scope)
        if self._hosts is not None:
            host = _hostname(headers.get("host", ""))
            if host not in self._hosts:
                raise BadHost(
                    f"host: {host or '(none)'!r} is not a name this server answers to "
                    f"(allowed: {', '.join(sorted(self._hosts))})"
                )
        if self._token is not None and self._protected(_route_path(scope)):
            given = headers.get("authorization", "").removeprefix("Bearer ")
            if not given and self._cookie is not None:
                given = _cookie(headers.get("cookie", ""), self._cookie)
            if not token_matches(given, self._token):
                raise Unauthorized(f"missing or wrong token: {self._hint}")
        if scope["method"] not in _STATE_CHANGING:
            return
        if self._json_only:
            ctype = headers.get("content-type", "").partition(";")[0].strip().lower()
            if ctype != "application/json" and not ctype.endswith("+json"):
                raise UnsupportedMediaType(
                    f"content-type: expected application/json, got {ctype or '(none)'!r}"
                )
        if self._max_body is not None:
            length = headers.get("content-length", "")
            if length.isdigit() and int(length) > self._max_body:
                raise PayloadTooLarge(
                    f"body: {int(length):,} bytes is over the limit of {self._max_body:,}"
                )

    def _capped(self, receive: Receive) -> Receive:
        limit = self._max_body
        assert limit is not None
        seen = 0

        async def capped() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise PayloadTooLarge(f"body: over the limit of {limit:,} bytes")
            return message

        return capped


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}


def _hostname(host: str) -> str:
    """The name in a Host header, without port or IPv6 brackets, lowercased."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rpartition(":")[0] if ":" in host else host


def _route_path(scope: Scope) -> str:
    """The path inside the app (without the prefix it may be mounted under)."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path


def _cookie(header: str, name: str) -> str:
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(header)
    except Exception:  # a malformed Cookie header is no token
        return ""
    morsel = jar.get(name)
    return morsel.value if morsel is not None else ""


def _config(app: ASGIApp, log_level: str, graceful_s: float) -> uvicorn.Config:
    import uvicorn

    return uvicorn.Config(
        app,
        log_level=log_level,
        access_log=False,
        lifespan="off",
        # httptools and uvloop when installed (uvicorn[standard]), else h11 and asyncio
        loop="auto",
        http="auto",
        timeout_graceful_shutdown=int(graceful_s),
    )


class ServerThread:
    """uvicorn serving ``app`` from ``sock`` on a daemon thread.

    ``start()`` returns once connections are accepted (raises ``RuntimeError`` if the
    server dies or ``timeout_s`` passes first); ``stop()`` shuts down gracefully, then
    forcibly, waits for the thread and closes the socket. Both are idempotent.
    """

    def __init__(
        self,
        app: ASGIApp,
        sock: socket.socket,
        *,
        name: str = "boltrl-server",
        log_level: str = "warning",
        graceful_s: float = 2,
    ) -> None:
        import uvicorn

        self.sock = sock
        self.url = url_of(sock)
        self._server = uvicorn.Server(_config(app, log_level, graceful_s))
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name=name, daemon=True
        )
        self._stopped = False

    def start(self, timeout_s: float = 10.0) -> None:
        if self._thread.is_alive() or self._stopped:
            return
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the server on {self.url} did not start")
            self._thread.join(0.005)

    def stop(self, timeout_s: float = 5.0) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self._thread.is_alive():
            self._server.should_exit = True
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                self._server.force_exit = True
                self._thread.join(timeout_s)
        self.sock.close()


def serve_forever(
    app: ASGIApp,
    sock: socket.socket,
    *,
    log_level: str = "info",
    graceful_s: float = 3,
    on_exit: Callable[[], Any] | None = None,
) -> None:
    """Serve ``app`` from ``sock`` in the foreground until SIGINT/SIGTERM; ``on_exit`` runs
    when the signal arrives (end live streams there, or shutdown waits for them)."""
    import uvicorn

    class _Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            if on_exit is not None:
                on_exit()
            super().handle_exit(sig, frame)

    try:
        _Server(_config(app, log_level, graceful_s)).run(sockets=[sock])
    finally:
        sock.close()
