"""boltrl_autogen (placeholder until its issue lands)."""

from __future__ import annotations

__all__: list[str] = []
