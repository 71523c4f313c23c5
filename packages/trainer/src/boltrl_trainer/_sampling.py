"""The batched sampling loop behind TransformersBackend (imports torch; loaded on first use).

One loop runs several independent requests ("rows") through one model: a left-padded
prefill, then one token per step for every unfinished row, with a KV cache. Attention mask
and per-row position ids make a padded row compute what it would compute alone (up to
float noise). Rows that finish leave the batch (their cache rows are dropped); requests
that arrive meanwhile are prefilled and join it between steps (continuous batching).

Prompts are computed once per loop: rows with the same prompt ids (the samples of a GRPO
group, arriving together or one by one) share one prefill; its keys, values and last
logits are copied into each row's own cache row, so every row then decodes on its own.
On a CPU the prefill of 64 demo prompts (~47 tokens each) was over half of a step's
generation time, and 8 of them are distinct (benchmarks/README.md, Training).

Logprobs: for ``temperature > 0`` each recorded logprob is ``log_softmax(logits / T)`` at
the sampled id over the full vocabulary, i.e. the temperature-scaled distribution *before*
top-p truncation (what a trainer recomputes from the same logits; with ``top_p = 1`` it is
exactly the sampling distribution). For ``temperature == 0`` (greedy) it is
``log_softmax(logits)`` at the argmax, the model's unscaled distribution.
"""

from __future__ import annotations

import inspect
from collections import OrderedDict
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


_NUCLEUS_PROBE = 256  # top-p looks at this many top tokens first; a full sort only if needed


def _draw(probs: torch.Tensor, top_p: float, u: float) -> int:
    """Inverse-CDF draw from ``probs`` [V] restricted to its top-p nucleus.

    The nucleus keeps tokens, most likely first, while the mass before them is below
    ``top_p`` (the first always stays). ``u`` is uniform in [0, 1).
    """
    if top_p < 1.0:
        vals, order = probs.topk(min(_NUCLEUS_PROBE, probs.numel()))  # [k], descending
        if float(vals.sum()) < top_p:  # the nucleus is wider than the probe: sort it all
            vals, order = probs.sort(descending=True)
        keep = int(((vals.cumsum(0) - vals) < top_p).sum())
        vals, order = vals[:keep], order[:keep]
    else:
        order = None
        vals = probs
    cdf = vals.cumsum(0, dtype=torch.float64)  # [n]; float64 so the tail keeps its mass
    target = torch.tensor([u * float(cdf[-1])], dtype=cdf.dtype, device=cdf.device)
    index = min(int(torch.searchsorted(cdf, target, right=True)[0]), vals.numel() - 1)
    return index if order is None else int(order[index])


def _sample(
    logits: torch.Tensor, rows: list[Row], shared: torch.Generator | None
) -> tuple[list[int], list[float]]:
    """Pick one token per row. ``logits``: [b, V] float32. Returns ids and their logprobs."""
    device = logits.device
    temps = torch.tensor([r.temperature for r in rows], device=device)  # [b]
    greedy = temps <= 0
    scale = torch.where(greedy, torch.ones_like(temps), temps)
    logprobs = torch.log_softmax(logits / scale[:, None], dim=-1)  # [b, V]
    chosen = logprobs.argmax(dim=-1).tolist()  # [b]; greedy rows keep theirs
    for i, row in enumerate(rows):
        if row.temperature > 0:
            gen = row.generator or shared
            u = float(torch.rand(1, generator=gen, device=gen.device if gen else device)[0])
            chosen[i] = _draw(logprobs[i].exp(), row.top_p, u)
    index = torch.tensor(chosen, device=device)[:, None]  # [b, 1]
    picked = logprobs.gather(1, index)[:, 0]  # [b]
    return chosen, picked.tolist()


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


@dataclass
class _Batch:
    """The rows in flight and their cache: mask [b, S] (0 = padding), next_pos [b]."""

    rows: list[Row]
    cache: Any
    mask: torch.Tensor
    next_pos: torch.Tensor
    tokens: torch.Tensor | None = None
    """The ids sampled last, [b]: the next step's input."""

    def select(self, keep: list[int]) -> None:
        """Keep only the rows at ``keep`` (cache rows included)."""
        if len(keep) == len(self.rows):
            return
        index = torch.tensor(keep, dtype=torch.long, device=self.mask.device)
        self.cache.batch_select_indices(index)
        self.rows = [self.rows[i] for i in keep]
        self.mask, self.next_pos = self.mask[index], self.next_pos[index]
        if self.tokens is not None:
            self.tokens = self.tokens[index]


def _mergeable(cache: Any) -> bool:
    """Whether the cache is made of plain growing layers whose tensors we may pad and join."""
    from transformers.cache_utils import DynamicLayer

    layers = list(getattr(cache, "layers", None) or [])
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


def _left_pad(x: torch.Tensor, n: int, dim: int) -> torch.Tensor:
    if n == 0:
        return x
    shape = list(x.shape)
    shape[dim] = n
    return torch.cat([x.new_zeros(shape), x], dim=dim)


def _merge(a: _Batch, b: _Batch) -> None:
    """Append ``b``'s rows to ``a``: both caches are left-padded to one width, then joined.

    Cache tensors are [b, heads, S, head_dim]; keys are stored after RoPE, so padding in
    front changes nothing for a row (masked out; each row keeps its own positions).
    """
    width = max(a.mask.shape[1], b.mask.shape[1])
    pad_a, pad_b = width - a.mask.shape[1], width - b.mask.shape[1]
    for la, lb in zip(a.cache.layers, b.cache.layers, strict=True):
        la.keys = torch.cat([_left_pad(la.keys, pad_a, 2), _left_pad(lb.keys, pad_b, 2)])
        la.values = torch.cat([_left_pad(la.values, pad_a, 2), _left_pad(lb.values, pad_b, 2)])
    a.mask = torch.cat([_left_pad(a.mask, pad_a, 1), _left_pad(b.mask, pad_b, 1)])
    a.next_pos = torch.cat([a.next_pos, b.next_pos])
    assert a.tokens is not None and b.tokens is not None
    a.tokens = torch.cat([a.tokens, b.tokens])
    a.rows = a.rows + b.rows


def _trim(batch: _Batch) -> None:
    """Drop leading cache columns that are padding for every row (left by finished rows)."""
    first = int(batch.mask.any(0).int().argmax())
    if first > 0:
        for layer in batch.cache.layers:
            layer.keys, layer.values = layer.keys[:, :, first:], layer.values[:, :, first:]
        batch.mask = batch.mask[:, first:]


_PROMPT_CACHE_POSITIONS = 8192
"""Most prompt positions a loop keeps computed for later rows with the same prompt (for
SmolLM2-135M in float32, 46 KB of keys and values per position)."""


@dataclass(eq=False)
class _Prompt:
    """One prompt's prefill, shared by every row of a loop with the same prompt ids."""

    keys: list[torch.Tensor]
    """Per layer, [1, kv_heads, length, head_dim] (after RoPE, positions from 0)."""
    values: list[torch.Tensor]
    logits: torch.Tensor
    """[V] float32: the logits that predict the first reply token."""
    length: int


class Sampler:
    """Runs rows through one model until all are done, admitting newcomers between steps.

    ``admit(n)`` is called before every step with the number of free slots and returns the
    rows to add (possibly none); new rows are prefilled on their own and joined to the
    running batch, so a request that arrives mid-generation need not wait for the others.
    Joining needs plain ``DynamicLayer`` caches; for other caches nothing is admitted.
    """

    def __init__(
        self,
        model: Any,
        *,
        pad_id: int,
        eos_ids: frozenset[int],
        decode: Callable[[list[int]], str],
        on_finish: Callable[[Row], None],
        generator: torch.Generator | None = None,
        stats: dict[str, int] | None = None,
        on_token: Callable[[Row], None] | None = None,
    ) -> None:
        self.model = model
        self.on_token = on_token
        """Called with each row that sampled a token and goes on (token streaming); a
        row that stops goes to ``on_finish`` instead."""
        self.pad_id = pad_id
        self.eos_ids = eos_ids
        self.decode = decode
        self.on_finish = on_finish
        self.generator = generator
        self.device = next(model.parameters()).device
        self.cache_arg = _cache_argument(model)
        self.stats = stats if stats is not None else {}
        """Counters updated live: ``steps`` (forward passes, prefills included),
        ``row_steps`` (rows carried, summed over passes) and ``prefill_tokens`` (prompt
        positions computed: a prompt shared by several rows counts once)."""
        self._prompts: OrderedDict[tuple[int, ...], _Prompt] = OrderedDict()
        """Prompts computed in this loop (one policy), for later rows with the same ids."""
        self._prompt_positions = 0

    def _forward(self, cache: Any, **kwargs: Any) -> torch.Tensor:
        self.stats["steps"] = self.stats.get("steps", 0) + 1
        rows = int(kwargs["input_ids"].shape[0])
        self.stats["row_steps"] = self.stats.get("row_steps", 0) + rows
        return _forward(self.model, self.cache_arg, cache, **kwargs)

    def _prefill(self, rows: list[Row]) -> tuple[_Batch, torch.Tensor]:
        """The batch of ``rows`` after their prompts, and its next logits [b, V].

        Each distinct prompt is computed once: rows with the same prompt ids (a GRPO
        group's samples, a prompt seen earlier in this loop) share its keys and values,
        copied into their own cache rows, and its last logits."""
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        if not _mergeable(cache):  # layers we cannot rebuild: one padded pass over all rows
            prompts = self._compute([r.prompt_ids for r in rows], cache, keep=False)
            return self._assemble(rows, prompts, cache, built=True)
        keys = [tuple(r.prompt_ids) for r in rows]
        new = [k for k in dict.fromkeys(keys) if k not in self._prompts]
        fresh = dict(zip(new, self._compute([list(k) for k in new]), strict=True)) if new else {}
        entries = [fresh[k] if k in fresh else self._prompts[k] for k in keys]
        self._remember(fresh)
        return self._assemble(rows, entries, cache)

    def _compute(
        self, prompts: list[list[int]], cache: Any = None, *, keep: bool = True
    ) -> list[_Prompt]:
        """One left-padded pass over ``prompts`` (into ``cache`` when given); each one's
        logits, and with ``keep`` its keys and values (views of the pass's cache)."""
        from transformers import DynamicCache

        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)  # [n, L]
        mask = torch.zeros((len(prompts), width), dtype=torch.long)  # [n, L], 0 = padding
        for i, p in enumerate(prompts):
            input_ids[i, width - len(p) :] = torch.tensor(p)
            mask[i, width - len(p) :] = 1
        input_ids, mask = input_ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # [n, L], real tokens count from 0
        if cache is None:
            cache = DynamicCache(config=self.model.config)
        self.stats["prefill_tokens"] = self.stats.get("prefill_tokens", 0) + sum(map(len, prompts))
        logits = self._forward(
            cache, input_ids=input_ids, attention_mask=mask, position_ids=positions
        )
        layers = list(cache.layers) if keep else []
        out = []
        for i, p in enumerate(prompts):
            start = width - len(p)
            out.append(
                _Prompt(
                    [layer.keys[i : i + 1, :, start:] for layer in layers],
                    [layer.values[i : i + 1, :, start:] for layer in layers],
                    logits[i],
                    len(p),
                )
            )
        return out

    def _remember(self, fresh: dict[tuple[int, ...], _Prompt]) -> None:
        """Keep new prompts for later rows, oldest forgotten past the position budget."""
        for key, prompt in fresh.items():
            if prompt.length > _PROMPT_CACHE_POSITIONS:
                continue
            self._prompts[key] = prompt
            self._prompt_positions += prompt.length
        while self._prompt_positions > _PROMPT_CACHE_POSITIONS:
            _, old = self._prompts.popitem(last=False)
            self._prompt_positions -= old.length

    def _assemble(
        self, rows: list[Row], entries: list[_Prompt], cache: Any, *, built: bool = False
    ) -> tuple[_Batch, torch.Tensor]:
        """The batch whose row i continues ``entries[i]``; ``built``: ``cache`` already
        holds exactly these rows (the pass that computed them)."""
        width = max(e.length for e in entries)
        if built:
            logits = torch.stack([e.logits for e in entries])
        else:
            distinct = list(dict.fromkeys(entries))  # _Prompt hashes by identity
            spread = distinct != entries  # then row i takes distinct[select[i]]
            index = {id(e): i for i, e in enumerate(distinct)}
            select = torch.tensor([index[id(e)] for e in entries], device=self.device)
            for li, layer in enumerate(cache.layers):
                parts = [(e.keys[li], e.values[li], width - e.length) for e in distinct]
                keys = torch.cat([_left_pad(k, pad, 2) for k, _, pad in parts])  # [n, h, S, d]
                values = torch.cat([_left_pad(v, pad, 2) for _, v, pad in parts])
                if spread:
                    keys, values = keys.index_select(0, select), values.index_select(0, select)
                layer.update(keys, values)
            logits = torch.stack([e.logits for e in distinct])  # [n, V]
            if spread:
                logits = logits.index_select(0, select)
        mask = torch.zeros((len(rows), width), dtype=torch.long, device=self.device)  # [b, S]
        for i, e in enumerate(entries):
            mask[i, width - e.length :] = 1
        next_pos = torch.tensor([e.length for e in entries], device=self.device)  # [b]
        return _Batch(list(rows), cache, mask, next_pos), logits

    def _advance(self, batch: _Batch, logits: torch.Tensor) -> None:
        """Sample one token per row, finish the rows that stop, drop them from the batch."""
        tokens, logprobs = _sample(logits, batch.rows, self.generator)
        keep: list[int] = []
        for i, (row, tok, lp) in enumerate(zip(batch.rows, tokens, logprobs, strict=True)):
            row.ids.append(tok)
            row.logprobs.append(lp)
            _check_stop(row, self.eos_ids, self.decode)
            if row.finish_reason is None:
                keep.append(i)
                if self.on_token is not None:
                    self.on_token(row)
            else:
                self.on_finish(row)
        batch.tokens = torch.tensor(tokens, device=self.device)
        batch.select(keep)

    @torch.no_grad()
    def run(self, rows: list[Row], admit: Callable[[int], list[Row]], max_batch: int) -> None:
        """Sample until every row (first and admitted) is done. Blocking, on this thread.

        Every row needs ``max_new_tokens >= 1``.
        """
        batch, logits = self._prefill(rows)
        joinable = _mergeable(batch.cache)
        while True:
            self._advance(batch, logits)
            free = max_batch - len(batch.rows)
            if joinable and free > 0 and (newcomers := admit(free)):
                fresh, fresh_logits = self._prefill(newcomers)
                self._advance(fresh, fresh_logits)
                if fresh.rows:
                    if batch.rows:
                        _merge(batch, fresh)
                    else:
                        batch = fresh
            if not batch.rows:
                return
            if joinable:
                _trim(batch)
            assert batch.tokens is not None
            batch.mask = torch.cat([batch.mask, batch.mask.new_ones((len(batch.rows), 1))], 1)
            logits = self._forward(
                batch.cache,
                input_ids=batch.tokens[:, None],  # [b, 1]
                attention_mask=batch.mask,  # [b, S + 1]
                position_ids=batch.next_pos[:, None],  # [b, 1]
            )
            batch.next_pos = batch.next_pos + 1
