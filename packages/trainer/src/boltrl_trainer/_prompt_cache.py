"""Keys and values of token sequences the model already computed, found by longest prefix.

An agent sends the same long beginning again and again: the system prompt and the tool
schemas open every call, and a multi-turn call's prompt is the previous call's prompt,
its reply and a tool result. ``PromptCache`` keeps what the sampling loop computed for
such sequences (a prompt's prefill, a finished reply's whole row) so that a new prompt
computes only what follows the longest sequence it shares with one of them, the way
vLLM's automatic prefix caching and SGLang's radix attention do on a GPU.

Entries hold one model's keys and values under one set of weights: the owner clears the
cache whenever the weights may change (``TransformersBackend.paused``). Positions count
from 0 in every entry, so an entry's first ``m`` keys (stored after RoPE) are exactly the
first ``m`` keys of any sequence that starts with the same ``m`` ids.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["DEFAULT_CACHE_POSITIONS", "CachedPrefix", "PromptCache", "common_prefix"]

DEFAULT_CACHE_POSITIONS = 16384
"""Positions a backend keeps by default (for SmolLM2-135M in float32, 46 KB of keys and
values each: ~750 MB at most)."""


@dataclass(eq=False)
class CachedPrefix:
    """A computed token sequence: its ids, per-layer keys and values, and (for a prompt)
    the logits that predict the token after it."""

    ids: tuple[int, ...]
    keys: list[torch.Tensor]
    """Per layer, [1, kv_heads, len(ids), head_dim], positions 0 .. len(ids) - 1."""
    values: list[torch.Tensor]
    logits: torch.Tensor | None
    """[V] float32 predicting the next token; None when not computed (a finished reply's
    row, whose last sampled token was never fed), so the entry serves only as a prefix."""

    @property
    def length(self) -> int:
        return len(self.ids)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of ``a`` and ``b`` (binary search over slice
    comparisons, which run in C: ~log2(n) of them)."""
    lo, hi = 0, min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    while hi - lo > 1:  # invariant: a[:lo] == b[:lo], a[:hi] != b[:hi]
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class PromptCache:
    """Entries by longest shared prefix, least recently used dropped past a position budget.

    Not thread-safe: one sampling thread uses it (the backend's worker, under its lock).
    """

    def __init__(self, max_positions: int) -> None:
        if max_positions < 0:
            raise ValueError("max_positions: must be >= 0")
        self.max_positions = max_positions
        """Most positions kept (for SmolLM2-135M in float32, 46 KB of keys and values each)."""
        self._entries: OrderedDict[tuple[int, ...], CachedPrefix] = OrderedDict()
        self._positions = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def positions(self) -> int:
        """Positions held now."""
        return self._positions

    def exact(self, ids: tuple[int, ...]) -> CachedPrefix | None:
        """The entry for exactly ``ids`` with its next-token logits, if any (marked used)."""
        entry = self._entries.get(ids)
        if entry is None or entry.logits is None:
            return None
        self._entries.move_to_end(ids)
        return entry

    def longest(
        self, ids: Sequence[int], *, whole: bool = False
    ) -> tuple[CachedPrefix | None, int]:
        """The entry sharing the longest prefix with ``ids`` and that length, capped at
        ``len(ids) - 1`` so that at least the last position is computed (its logits), or
        at ``len(ids)`` with ``whole``; ``(None, 0)`` when nothing is shared. The entry
        is marked used."""
        best, best_len = None, 0
        cap = len(ids) if whole else len(ids) - 1
        for entry in self._entries.values():
            if best_len >= min(cap, entry.length):
                continue  # it cannot beat the best match
            n = min(common_prefix(entry.ids, ids), cap)
            if n > best_len:
                best, best_len = entry, n
        if best is not None:
            self._entries.move_to_end(best.ids)
        return best, best_len

    def add(self, entry: CachedPrefix) -> None:
        """Keep ``entry`` (replacing one with the same ids unless that one has logits and
        this one has none), then drop the least recently used past the budget."""
        if entry.length > self.max_positions:
            return
        old = self._entries.get(entry.ids)
        if old is not None:
            if old.logits is not None and entry.logits is None:
                self._entries.move_to_end(entry.ids)
                return
            self._positions -= old.length
        self._entries[entry.ids] = entry
        self._entries.move_to_end(entry.ids)
        self._positions += entry.length
        while self._positions > self.max_positions:
            _, dropped = self._entries.popitem(last=False)
            self._positions -= dropped.length

    def clear(self) -> None:
        """Forget every entry (the weights changed)."""
        self._entries.clear()
        self._positions = 0
