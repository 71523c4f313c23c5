"""Fast JSON for the gateway's hot path: orjson when installed, the stdlib otherwise."""

from __future__ import annotations

import json
from typing import Any

_orjson: Any
try:  # orjson is optional: several times faster on the large token-id lists we echo
    import orjson as _orjson
except ImportError:  # pragma: no cover - exercised only where orjson is absent
    _orjson = None


def loads(data: bytes | str) -> Any:
    """Parse JSON; raises ``ValueError`` on malformed input."""
    if _orjson is not None:
        return _orjson.loads(data)
    return json.loads(data)


def dumps(obj: Any) -> bytes:
    """Serialize to compact UTF-8 JSON bytes (non-ASCII kept as is)."""
    if _orjson is not None:
        out: bytes = _orjson.dumps(obj)
        return out
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


def dumps_str(obj: Any) -> str:
    """Serialize to a compact JSON ``str`` (tool-call arguments travel as strings)."""
    return dumps(obj).decode()
