"""What both API shapes derive from a ``Generation``: the assistant message, usage, and
the pieces a stream is cut into."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from boltrl._common import JSON
from boltrl.gateway.backend import Generation, GenerationRequest

_WORDS = re.compile(r"\s*\S+\s*|\s+")
MAX_PIECES = 32
"""A stream carries at most this many text deltas (the backend answers whole turns; the
pieces exist so clients exercise their stream handling, not to pace output)."""


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


def assistant_message(gen: Generation) -> JSON:
    """The generated turn as an OpenAI chat assistant message (normal form)."""
    msg: JSON = {"role": "assistant", "content": gen.text}
    if gen.tool_calls:
        msg["tool_calls"] = gen.tool_calls
    return msg


def usage_of(gen: Generation) -> dict[str, int]:
    """``prompt_tokens`` / ``completion_tokens`` / ``total_tokens``: the backend's own
    counts when given, else the lengths of the token ids (0 when unknown)."""
    u = gen.usage
    prompt = u.get("prompt_tokens")
    if prompt is None:
        prompt = len(gen.prompt_token_ids) if gen.prompt_token_ids is not None else 0
    completion = u.get("completion_tokens")
    if completion is None:
        completion = len(gen.response_token_ids) if gen.response_token_ids is not None else 0
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": u.get("total_tokens", prompt + completion),
    }


def pieces(text: str, limit: int = MAX_PIECES) -> list[str]:
    """``text`` cut at word boundaries into at most ``limit`` pieces that join back to it."""
    words = _WORDS.findall(text)
    if len(words) <= limit:
        return words
    per = -(-len(words) // limit)
    return ["".join(words[i : i + per]) for i in range(0, len(words), per)]


def split(s: str, n: int = 4) -> list[str]:
    """``s`` cut into at most ``n`` roughly equal non-empty pieces (tool-call arguments)."""
    if not s:
        return []
    size = -(-len(s) // n)
    return [s[i : i + size] for i in range(0, len(s), size)]
