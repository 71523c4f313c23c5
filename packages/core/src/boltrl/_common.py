"""The two small pieces every boltrl module shares, defined once.

Stdlib-only on purpose: the gateway's hot path and the adapters import it without
pulling in pydantic or anything else.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["JSON", "new_id"]

JSON = dict[str, Any]
"""A JSON object as Python sees it after ``json.loads``."""


def new_id(prefix: str) -> str:
    """A fresh unique id such as ``ro-3f2a…`` (``<prefix>-<32 hex digits>``).

    Built from ``os.urandom`` rather than ``uuid.uuid4`` because adapters mint one per
    record on the agent's path, where building a ``uuid.UUID`` costs a few µs.
    """
    return f"{prefix}-{os.urandom(16).hex()}"
