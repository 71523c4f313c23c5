"""``UpstreamBackend``: serve the gateway's calls from any OpenAI-compatible server.

In front of vLLM (≥ 0.10.2) it records exact token ids: every request asks for
``return_token_ids`` and ``logprobs``, and vLLM answers with ``prompt_token_ids`` (on the
response, or the choice) and ``token_ids`` per choice, plus per-token logprobs. A server
that returns no ids (SGLang without the extension, hosted APIs) still serves; its calls
are recorded with token ids None, which the trainer refuses loudly rather than
re-tokenizing. A server that rejects the unknown ``return_token_ids`` field is asked
once more without it, and never again.

Requests go over boltrl's own small HTTP/1.1 client (``boltrl._http``: a fraction of
httpx's cost per request); through httpx when the environment names an HTTP proxy for
the upstream (``HTTP_PROXY`` / ``HTTPS_PROXY`` / ``ALL_PROXY``, minus ``NO_PROXY``).
"""

from __future__ import annotations

import asyncio
import logging
import re
import urllib.request
import weakref
from typing import Any, Protocol
from urllib.parse import urlsplit

import httpx

from boltrl import _http
from boltrl._common import JSON
from boltrl.errors import BackendError, BackendUnavailable
from boltrl.gateway._json import dumps, loads
from boltrl.gateway.backend import Generation, GenerationRequest

log = logging.getLogger(__name__)

_TOKEN_ID = re.compile(r"token_id:(\d+)")
_UNAVAILABLE = {408, 429, 502, 503, 504}


def _base_url(url: str) -> str:
    url = url.rstrip("/")
    if urlsplit(url).path in ("", "/"):
        url += "/v1"  # a bare server address: OpenAI-compatible servers serve under /v1
    return url


def _proxied(url: str) -> bool:
    """Whether the environment routes requests to ``url`` through an HTTP proxy."""
    parts = urlsplit(url)
    proxies = urllib.request.getproxies_environment()
    if parts.scheme not in proxies and "all" not in proxies:
        return False
    return not urllib.request.proxy_bypass(parts.hostname or "")


class _Answer(Protocol):
    @property
    def status_code(self) -> int: ...
    @property
    def content(self) -> bytes: ...
    @property
    def text(self) -> str: ...


def _ids(value: Any) -> list[int] | None:
    if isinstance(value, list) and all(isinstance(i, int) for i in value):
        return value
    return None


class UpstreamBackend:
    """A ``Backend`` forwarding to an OpenAI-compatible ``/chat/completions``.

    ``base_url`` is the server's OpenAI base URL (``http://host:8000/v1``; a bare
    ``http://host:8000`` gets ``/v1`` appended). ``model`` is the name sent upstream and
    served under ``/v1/models``. ``policy_version`` is what calls are recorded with; the
    trainer sets it after publishing new weights to the server. Connection failures,
    timeouts and 408/429/502/503/504 raise ``BackendUnavailable``; any other non-2xx or
    unreadable answer raises ``BackendError`` with the upstream's message.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        *,
        timeout_s: float = 600.0,
        request_token_ids: bool = True,
        policy_version: int = 0,
        max_connections: int = 256,
    ) -> None:
        self.base_url = _base_url(base_url)
        self.model = model
        self.policy_version = policy_version
        self._ask_ids = request_token_ids
        self._headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout_s = timeout_s
        self._max_connections = max_connections
        self._via_httpx = _proxied(self.base_url)
        # Connections belong to the event loop that opened them; the backend may outlive
        # one gateway's loop and serve another's, so each loop gets its own pool.
        self._clients: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, _http.Pool | httpx.AsyncClient
        ] = weakref.WeakKeyDictionary()

    def _client(self) -> _http.Pool | httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            if self._via_httpx:
                client = httpx.AsyncClient(
                    base_url=self.base_url,
                    headers=self._headers,
                    timeout=httpx.Timeout(self._timeout_s, connect=10.0),
                    limits=httpx.Limits(
                        max_connections=self._max_connections, max_keepalive_connections=64
                    ),
                )
            else:
                client = _http.Pool(
                    self.base_url,
                    self._headers,
                    timeout_s=self._timeout_s,
                    connect_timeout_s=10.0,
                    max_connections=self._max_connections,
                    max_idle=64,
                )
            self._clients[loop] = client
        return client

    @property
    def model_name(self) -> str:
        return self.model

    def _body(self, request: GenerationRequest) -> JSON:
        body: JSON = {"model": self.model, "messages": request.messages, "logprobs": True}
        if self._ask_ids:
            body["return_token_ids"] = True
        if request.tools:
            body["tools"] = request.tools
        if request.tool_choice is not None:
            body["tool_choice"] = request.tool_choice
        for key in ("temperature", "top_p", "max_tokens", "seed"):
            value = getattr(request, key)
            if value is not None:
                body[key] = value
        if request.stop:
            body["stop"] = request.stop
        return body

    async def _post(self, body: JSON) -> _Answer:
        client = self._client()
        payload = dumps(body)
        try:
            if isinstance(client, _http.Pool):
                return await client.post_json("/chat/completions", payload)
            headers = {"content-type": "application/json"}
            return await client.post("/chat/completions", content=payload, headers=headers)
        except _http.ProtocolError as e:
            raise BackendError(f"upstream {self.base_url} failed: {e}") from e
        except (_http.TransportError, httpx.TimeoutException, httpx.NetworkError) as e:
            raise BackendUnavailable(f"upstream {self.base_url} unreachable: {e!r}") from e
        except httpx.HTTPError as e:
            raise BackendError(f"upstream {self.base_url} failed: {e!r}") from e

    async def generate(self, request: GenerationRequest) -> Generation:
        """Forward the request; returns the answer with whatever token truth it carried."""
        body = self._body(request)
        resp = await self._post(body)
        if resp.status_code == 400 and self._ask_ids and "return_token_ids" in resp.text:
            log.warning(
                "upstream %s rejects return_token_ids: calls get no token ids", self.base_url
            )
            self._ask_ids = False
            body.pop("return_token_ids")
            resp = await self._post(body)
        if resp.status_code >= 400:
            cls = BackendUnavailable if resp.status_code in _UNAVAILABLE else BackendError
            raise cls(f"upstream {self.base_url} answered {resp.status_code}: {resp.text[:500]}")
        try:
            return self._generation(loads(resp.content))
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise BackendError(f"upstream {self.base_url} sent an unreadable answer: {e!r}") from e

    def _generation(self, data: JSON) -> Generation:
        choice = data["choices"][0]
        message = choice["message"]
        prompt_ids = _ids(data.get("prompt_token_ids")) or _ids(choice.get("prompt_token_ids"))
        response_ids = _ids(choice.get("token_ids"))
        logprobs = None
        content = (choice.get("logprobs") or {}).get("content")
        if isinstance(content, list) and content:
            logprobs = [float(t["logprob"]) for t in content]
            if response_ids is None:  # vLLM --return-tokens-as-token-ids spells ids out
                spelled = [_TOKEN_ID.fullmatch(str(t.get("token", ""))) for t in content]
                if all(spelled):
                    response_ids = [int(m.group(1)) for m in spelled if m]
        if response_ids is not None and logprobs is not None and len(logprobs) != len(response_ids):
            log.warning(
                "upstream %s: %d logprobs for %d token ids; dropping the logprobs",
                self.base_url,
                len(logprobs),
                len(response_ids),
            )
            logprobs = None
        usage = {
            k: int(v)
            for k, v in (data.get("usage") or {}).items()
            if k in ("prompt_tokens", "completion_tokens", "total_tokens")
        }
        return Generation(
            text=message.get("content"),
            tool_calls=[_tool_call(tc, i) for i, tc in enumerate(message.get("tool_calls") or ())],
            finish_reason=choice.get("finish_reason") or "stop",
            prompt_token_ids=prompt_ids,
            response_token_ids=response_ids,
            response_logprobs=logprobs,
            policy_version=self.policy_version,
            model=data.get("model") or self.model,
            usage=usage,
        )

    async def aclose(self) -> None:
        """Close the connection pools. Idempotent; callable from any event loop (pools
        of loops that already stopped went with them)."""
        clients = list(self._clients.items())
        self._clients = weakref.WeakKeyDictionary()
        current = asyncio.get_running_loop()
        for loop, client in clients:
            if loop is current:
                await _close(client)
            elif loop.is_running():
                asyncio.run_coroutine_threadsafe(_close(client), loop)


async def _close(client: _http.Pool | httpx.AsyncClient) -> None:
    if isinstance(client, _http.Pool):
        client.close()
    else:
        await client.aclose()


def _tool_call(tc: JSON, index: int) -> JSON:
    fn = tc["function"]
    return {
        "id": tc.get("id") or f"call_{index}",
        "type": "function",
        "function": {"name": fn["name"], "arguments": fn.get("arguments") or ""},
    }
