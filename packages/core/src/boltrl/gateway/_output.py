"""What both API shapes derive from a ``Generation``: the assistant message, usage, and
the pieces a stream is cut into. (The parsed request is in ``_request``.)"""

from __future__ import annotations

import re

from boltrl._common import JSON
from boltrl.gateway.backend import Generation

_WORDS = re.compile(r"\s*\S+\s*|\s+")
MAX_PIECES = 32
"""A stream carries at most this many text deltas (the backend answers whole turns; the
pieces exist so clients exercise their stream handling, not to pace output)."""


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
