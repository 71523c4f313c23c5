"""The batched sampling loop behind TransformersBackend (imports torch; loaded on first use).

One call runs several independent requests ("rows") through one model: a left-padded
prefill, then one token per step for every unfinished row, with a KV cache. Attention mask
and per-row position ids make a padded row compute what it would compute alone (up to
float noise). Rows that finish leave the batch (their cache rows are dropped), so a long
reply does not make the others pay for padding.

Logprobs: for ``temperature > 0`` each recorded logprob is ``log_softmax(logits / T)`` at
the sampled id over the full vocabulary, i.e. the temperature-scaled distribution *before*
top-p truncation (what a trainer recomputes from the same logits; with ``top_p = 1`` it is
exactly the sampling distribution). For ``temperature == 0`` (greedy) it is
``log_softmax(logits)`` at the argmax, the model's unscaled distribution.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(eq=False)
class Row:
    """One request in a batch, and what was sampled for it so far."""

    prompt_ids: list[int]
    max_new_tokens: int
    temperature: float
    top_p: float
    stop: list[str]
    generator: torch.Generator | None
    """Per-request generator (requests with a seed); None uses the batch's shared one."""
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    text_end: int | None = None
    """Where a matched stop string starts in the decoded text (the reply is cut there)."""


def _sample(
    logits: torch.Tensor, rows: list[Row], shared: torch.Generator | None
) -> tuple[list[int], list[float]]:
    """Pick one token per row. ``logits``: [b, V] float32. Returns ids and their logprobs."""
    device = logits.device
    temps = torch.tensor([r.temperature for r in rows], device=device)  # [b]
    greedy = temps <= 0
    scale = torch.where(greedy, torch.ones_like(temps), temps)
    logprobs = torch.log_softmax(logits / scale[:, None], dim=-1)  # [b, V]
    chosen = logprobs.argmax(dim=-1)  # [b]
    for i, row in enumerate(rows):
        if row.temperature <= 0:
            continue
        probs = logprobs[i].exp()  # [V]
        if row.top_p < 1.0:
            sorted_p, order = probs.sort(descending=True)
            # drop a token once the mass before it already reaches top_p (the first stays)
            drop = (sorted_p.cumsum(0) - sorted_p) >= row.top_p
            probs = probs.scatter(0, order[drop], 0.0)
        chosen[i] = torch.multinomial(probs, 1, generator=row.generator or shared)[0]
    picked = logprobs.gather(1, chosen[:, None])[:, 0]  # [b]
    return chosen.tolist(), picked.tolist()


def _check_stop(row: Row, eos_ids: frozenset[int], decode: Callable[[list[int]], str]) -> None:
    token = row.ids[-1]
    if token in eos_ids:
        row.finish_reason = "stop"
        return
    if row.stop:
        text = decode(row.ids)
        hits = [i for i in (text.find(s) for s in row.stop) if i >= 0]
        if hits:
            row.finish_reason, row.text_end = "stop", min(hits)
            return
    if len(row.ids) >= row.max_new_tokens:
        row.finish_reason = "length"


def _cache_argument(model: Any) -> str:
    """The forward() keyword taking the KV cache (``cache`` since transformers 5.24)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    try:
        params = inspect.signature(inner.forward).parameters
    except (TypeError, ValueError):  # pragma: no cover - exotic wrappers
        return "past_key_values"
    return "cache" if "cache" in params else "past_key_values"


def _forward(model: Any, cache_arg: str, cache: Any, **kwargs: Any) -> torch.Tensor:
    """Last-position logits, [b, V] float32."""
    out = model(use_cache=True, logits_to_keep=1, **{cache_arg: cache}, **kwargs)
    logits: torch.Tensor = out.logits[:, -1, :].float()
    return logits


@torch.no_grad()
def generate_rows(
    model: Any,
    rows: list[Row],
    *,
    pad_id: int,
    eos_ids: frozenset[int],
    decode: Callable[[list[int]], str],
    on_finish: Callable[[Row], None],
    generator: torch.Generator | None = None,
) -> None:
    """Sample every row to completion; call ``on_finish(row)`` as soon as each one stops.

    Blocking; runs on the caller's thread. Every row needs ``max_new_tokens >= 1``.
    """
    from transformers import DynamicCache

    device = next(model.parameters()).device
    width = max(len(r.prompt_ids) for r in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)  # [b, L]
    mask = torch.zeros((len(rows), width), dtype=torch.long)  # [b, L], 0 = left padding
    for i, r in enumerate(rows):
        input_ids[i, width - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids)
        mask[i, width - len(r.prompt_ids) :] = 1
    input_ids, mask = input_ids.to(device), mask.to(device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # [b, L], real tokens count from 0
    cache = DynamicCache(config=model.config)
    cache_arg = _cache_argument(model)
    logits = _forward(
        model, cache_arg, cache, input_ids=input_ids, attention_mask=mask, position_ids=positions
    )
    next_pos = positions[:, -1] + 1  # [b]
    active = list(rows)
    while True:
        tokens, logprobs = _sample(logits, active, generator)
        keep: list[int] = []
        for i, (row, tok, lp) in enumerate(zip(active, tokens, logprobs, strict=True)):
            row.ids.append(tok)
            row.logprobs.append(lp)
            _check_stop(row, eos_ids, decode)
            if row.finish_reason is None:
                keep.append(i)
            else:
                on_finish(row)
        if not keep:
            return
        step = torch.tensor(tokens, device=device)[:, None]  # [b, 1]
        if len(keep) < len(active):
            index = torch.tensor(keep, device=device)
            cache.batch_select_indices(index)
            mask, next_pos, step = mask[index], next_pos[index], step[index]
            active = [active[i] for i in keep]
        mask = torch.cat([mask, mask.new_ones((len(active), 1))], dim=1)  # [b, L + t]
        logits = _forward(
            model,
            cache_arg,
            cache,
            input_ids=step,
            attention_mask=mask,
            position_ids=next_pos[:, None],
        )
        next_pos = next_pos + 1
