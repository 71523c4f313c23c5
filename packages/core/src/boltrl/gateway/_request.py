"""A request as the gateway parses it: the JSON body read, and the ``ParsedCall`` that
both API shapes' parsers (``chat.parse``, ``responses.parse``) produce from it."""

from __future__ import annotations

from dataclasses import dataclass, field

from boltrl._common import JSON
from boltrl.gateway._errors import RequestError
from boltrl.gateway._json import loads
from boltrl.gateway.backend import GenerationRequest
from boltrl.store._checks import find_unreadable


@dataclass(slots=True)
class ParsedCall:
    """A validated request in the gateway's terms, whichever API it came through."""

    api: str
    """``chat.completions`` or ``responses``."""
    request: GenerationRequest
    """What the backend receives (``rollout_id`` is filled in by the route)."""
    stream: bool = False
    include_usage: bool = False
    """Chat only: send a final usage chunk (``stream_options.include_usage``)."""
    logprobs: bool = False
    """Chat only: return per-token logprobs in the response."""
    return_token_ids: bool = False
    """vLLM extension: return ``prompt_token_ids`` and per-choice ``token_ids``."""
    echo: JSON = field(default_factory=dict)
    """Responses only: request fields a Response object repeats back."""

    def record(self) -> JSON:
        """The normalized request as stored in ``LLMCall.request``."""
        r = self.request
        out: JSON = {"api": self.api, "model": r.model, "messages": r.messages}
        if r.tools is not None:
            out["tools"] = r.tools
        if r.tool_choice is not None:
            out["tool_choice"] = r.tool_choice
        for key in ("temperature", "top_p", "max_tokens", "seed"):
            value = getattr(r, key)
            if value is not None:
                out[key] = value
        if r.stop:
            out["stop"] = r.stop
        if self.stream:
            out["stream"] = True
        return out


def read_body(raw: bytes) -> JSON:
    """The request body as a JSON object; a ``RequestError`` (400) when it is not one, or
    holds what a record could not read back (``store._checks.check_readable``: NaN or
    ±inf, integers beyond int64, nesting deeper than ``MAX_DEPTH``), naming the field."""
    try:
        body = loads(raw)
    except (ValueError, RecursionError) as e:
        raise RequestError(f"the request body is not valid JSON: {e}", None) from e
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object", None)
    problem = find_unreadable("", body)
    if problem is not None:
        raise RequestError(problem[1], problem[0] or None)
    return body
