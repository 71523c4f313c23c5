"""Live streaming: a streamed call's text leaves as the backend samples it.

Used for a ``stream: true`` call when the backend is a
``boltrl.gateway.backend.StreamingBackend`` (the in-process TransformersBackend) and the
call did not ask for ``return_token_ids`` (whose prompt ids open the stream but are known
only at the end: such a call, like one to any other backend, is streamed from the
finished turn).

Order of a live stream: the opening chunk(s) with the first piece of text, then each
piece as it comes; when the backend's ``Generation`` arrives it is checked and the call
recorded, and only then is the rest written (the text the backend held back, tool
calls, the finish, usage, ``[DONE]`` / ``response.completed``), so an agent that has
read the whole stream can count on its call being recorded, as with a plain response.
A turn that brings no piece before its end (e.g. a reply that opens with a tool call,
known only once parsed) is answered exactly as a non-live stream.

A failure before the first piece is answered as a non-streamed call's is (502/503, the
call recorded ``failed``); once the stream has begun it can only end with an error event
(``data: {"error": …}``, which OpenAI clients raise as ``APIError``), the call recorded
``failed`` (a backend fault) or not at all (a refused record: the attempt is no longer
current).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol

from starlette.responses import Response, StreamingResponse

from boltrl.errors import BackendError, BackendUnavailable, BoltrlError
from boltrl.gateway._errors import error_body
from boltrl.gateway._json import dumps
from boltrl.gateway._output import pieces
from boltrl.gateway._request import ParsedCall
from boltrl.gateway.backend import Backend, Generation, StreamingBackend
from boltrl.gateway.chat import ChatStream
from boltrl.gateway.recording import check_generation
from boltrl.gateway.responses import ResponseStream

log = logging.getLogger(__name__)

SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


def streams_live(backend: Backend, call: ParsedCall) -> bool:
    """Whether ``call`` is answered by live streaming (see the module docstring)."""
    return call.stream and not call.return_token_ids and isinstance(backend, StreamingBackend)


class LiveWriter(Protocol):
    """One API shape's stream, written piece by piece."""

    def start(self) -> bytes:
        """What opens the stream, up to where text goes."""
        ...

    def text(self, piece: str) -> bytes: ...

    def end(self, gen: Generation, sent: str) -> bytes:
        """The rest, given the text already written (a prefix of ``gen.text``)."""
        ...


class ChatLive:
    """``LiveWriter`` of Chat Completions (``chat.ChatStream``)."""

    def __init__(self, call_id: str, created: int, model: str, call: ParsedCall) -> None:
        self.w = ChatStream(call_id, created, model, call)

    def start(self) -> bytes:
        return self.w.start(text=True)

    def text(self, piece: str) -> bytes:
        return self.w.text(piece)

    def end(self, gen: Generation, sent: str) -> bytes:
        rest = b"".join(self.w.text(p) for p in pieces((gen.text or "")[len(sent) :]))
        return rest + self.w.end(gen)


class ResponsesLive:
    """``LiveWriter`` of the Responses API (``responses.ResponseStream``)."""

    def __init__(self, resp_id: str, created: int, model: str, call: ParsedCall) -> None:
        self.w = ResponseStream(resp_id, created, model, call)

    def start(self) -> bytes:
        return self.w.start() + self.w.open_text()

    def text(self, piece: str) -> bytes:
        return self.w.text(piece)

    def end(self, gen: Generation, sent: str) -> bytes:
        return self.w.end(gen, sent)


async def serve(
    events: AsyncIterator[str | Generation],
    writer: LiveWriter,
    whole: Callable[[Generation], bytes],
    *,
    record: Callable[[Generation, float], Awaitable[None]],
    failed: Callable[[Exception], Awaitable[Response]],
    refused: Callable[[BoltrlError], Response],
) -> Response:
    """Answer a live-streamed call.

    ``events``: the backend's (``backend.stream_of``); ``whole(gen)``: the non-live
    stream body of a finished turn; ``record(gen, ended_at)``: record the served call
    (raises ``BoltrlError`` when the record is refused); ``failed(e)``: record a failed
    call and give its error response; ``refused(e)``: the response to a refused record.
    """
    try:
        first = await anext(aiter(events))
    except Exception as e:
        return await failed(e)
    if isinstance(first, Generation):  # nothing streamed: answer as a finished turn
        try:
            gen = check_generation(first)
        except Exception as e:
            return await failed(e)
        try:
            await record(gen, time.time())
        except BoltrlError as e:
            return refused(e)
        return Response(whole(gen), 200, headers=SSE_HEADERS, media_type="text/event-stream")
    return StreamingResponse(
        _body(first, events, writer, record=record, failed=failed),
        200,
        headers=SSE_HEADERS,
        media_type="text/event-stream",
    )


def _error_event(status: int, message: str, code: str | None) -> bytes:
    return b"data: " + dumps(error_body(status, message, code=code)) + b"\n\n"


async def _body(
    first: str,
    events: AsyncIterator[str | Generation],
    writer: LiveWriter,
    *,
    record: Callable[[Generation, float], Awaitable[None]],
    failed: Callable[[Exception], Awaitable[Response]],
) -> AsyncIterator[bytes]:
    sent = first
    yield writer.start() + writer.text(first)
    try:
        async for event in events:
            if isinstance(event, str):
                sent += event
                yield writer.text(event)
                continue
            gen = check_generation(event)
            break
        else:
            raise BackendError("the backend's stream ended without its Generation")
    except Exception as e:  # the backend failed mid-turn: recorded failed, as a 502/503
        await failed(e)
        status = 503 if isinstance(e, BackendUnavailable) else 502
        yield _error_event(status, f"backend error: {type(e).__name__}: {e}", "backend_error")
        return
    finally:
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()
    if not (gen.text or "").startswith(sent):  # the backend broke its promise
        log.warning("gateway: streamed text is not a prefix of the turn's text")
    try:
        await record(gen, time.time())
    except BoltrlError as e:  # refused (the attempt is no longer current): not recorded
        yield _error_event(e.status_code, str(e), e.code)
        return
    yield writer.end(gen, sent)
