"""The batched sampling loop behind TransformersBackend (imports torch; loaded on first use).

One loop runs several independent requests ("rows") through one model: a left-padded
prefill, then one token per step for every unfinished row, with a KV cache. Attention mask
and per-row position ids make a padded row compute what it would compute alone (up to
float noise). Rows that finish leave the batch (their cache rows are dropped); requests
that arrive meanwhile are prefilled and join it between steps (continuous batching).

Prompts are computed once and by their longest computed prefix (``_prompt_cache``): rows
with the same prompt ids (the samples of a GRPO group) share one prefill, whose keys,
values and last logits are copied into each row's own cache row; a prompt that starts
like one computed before (the system prompt and tools every call of an agent repeats, the
previous call's prompt and reply in a multi-turn episode) computes only what follows.
On a CPU the prefill of 64 demo prompts (~47 tokens each) was over half of a step's
generation time, and 8 of them are distinct (benchmarks/README.md, Training); an agent's
calls repeat a few hundred tokens of system prompt and tool schemas each.

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

from boltrl_trainer._prompt_cache import (
    DEFAULT_CACHE_POSITIONS,
    CachedPrefix,
    PromptCache,
    common_prefix,
)


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


_MIN_REUSE = 32
"""Fewest shared positions worth a pass of their own (a pass costs ~30 layers of Python
overhead; a few positions of prefill cost less)."""


def _logits(entry: CachedPrefix) -> torch.Tensor:
    if entry.logits is None:  # pragma: no cover - exact() returns prompts only
        raise AssertionError("a cached reply has no next-token logits")
    return entry.logits


class Sampler:
    """Runs rows through one model until all are done, admitting newcomers between steps.

    ``admit(n)`` is called before every step with the number of free slots and returns the
    rows to add (possibly none); new rows are prefilled on their own and joined to the
    running batch, so a request that arrives mid-generation need not wait for the others.
    Joining needs plain ``DynamicLayer`` caches; for other caches nothing is admitted.

    ``prompt_cache`` holds computed sequences of this model under its current weights
    (the caller clears it when they change); prompts are prefilled from their longest
    cached prefix, and every finished row is added to it (its prompt and reply: the
    beginning of the agent's next prompt). None: a private cache for this sampler.
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
        prompt_cache: PromptCache | None = None,
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
        ``row_steps`` (rows carried, summed over passes), ``prefill_tokens`` (prompt
        positions computed: a prompt shared by several rows counts once) and
        ``cached_tokens`` (prompt positions taken from the prompt cache instead)."""
        self.prompts = (
            prompt_cache if prompt_cache is not None else PromptCache(DEFAULT_CACHE_POSITIONS)
        )

    def _count(self, name: str, n: int) -> None:
        self.stats[name] = self.stats.get(name, 0) + n

    def _forward(self, cache: Any, **kwargs: Any) -> torch.Tensor:
        self._count("steps", 1)
        self._count("row_steps", int(kwargs["input_ids"].shape[0]))
        return _forward(self.model, self.cache_arg, cache, **kwargs)

    def _prefill(self, rows: list[Row]) -> tuple[_Batch, torch.Tensor]:
        """The batch of ``rows`` after their prompts, and its next logits [b, V].

        Each distinct prompt is computed once, from its longest cached prefix: rows with
        the same prompt ids share its keys and values (copied into their own cache
        rows) and its last logits."""
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        if not _mergeable(cache):  # layers we cannot rebuild: one padded pass over all rows
            prompts = self._extend(None, 0, [tuple(r.prompt_ids) for r in rows], cache)
            return self._assemble(rows, prompts, cache, built=True)
        keys = [tuple(r.prompt_ids) for r in rows]
        ready: dict[tuple[int, ...], CachedPrefix] = {}
        todo = []
        for key in dict.fromkeys(keys):
            entry = self.prompts.exact(key)
            if entry is None:
                todo.append(key)
            else:
                ready[key] = entry
                self._count("cached_tokens", entry.length)
        ready.update(self._compute(todo))
        return self._assemble(rows, [ready[k] for k in keys], cache)

    def _compute(self, prompts: list[tuple[int, ...]]) -> dict[tuple[int, ...], CachedPrefix]:
        """Compute ``prompts`` (distinct, none cached exactly) into the prompt cache, each
        from its longest cached prefix; a long beginning several of them share that the
        cache lacks (a first wave of calls to a new agent) is computed once first."""
        if self.prompts.max_positions:
            self._share_beginnings(prompts)
        groups: dict[int, tuple[CachedPrefix | None, int, list[tuple[int, ...]]]] = {}
        for p in prompts:
            base, m = self.prompts.longest(p)
            if m < _MIN_REUSE:
                base, m = None, 0
            _, m0, members = groups.setdefault(id(base), (base, m, []))
            members.append(p)
            groups[id(base)] = (base, min(m0, m), members)
        out: dict[tuple[int, ...], CachedPrefix] = {}
        for base, m, members in groups.values():
            for entry in self._extend(base, m, members):
                self.prompts.add(entry)
                out[entry.ids] = entry
        return out

    def _share_beginnings(self, prompts: list[tuple[int, ...]]) -> None:
        """Cache the beginnings that runs of ``prompts`` (in sorted order) share beyond
        what the cache already holds, each computed once."""
        ordered = sorted(prompts)
        i = 0
        while i < len(ordered) - 1:
            j, shared = i, len(ordered[i]) - 1
            while j + 1 < len(ordered):
                n = min(common_prefix(ordered[j], ordered[j + 1]), len(ordered[j + 1]) - 1)
                if min(shared, n) < _MIN_REUSE:
                    break
                shared, j = min(shared, n), j + 1
            if j > i:
                beginning = ordered[i][:shared]
                base, m = self.prompts.longest(beginning, whole=True)
                if shared - m >= _MIN_REUSE and shared <= self.prompts.max_positions:
                    if m < _MIN_REUSE:
                        base, m = None, 0
                    [entry] = self._extend(base, m, [beginning])
                    self.prompts.add(entry)
            i = j + 1

    def _extend(
        self,
        base: CachedPrefix | None,
        m: int,
        prompts: list[tuple[int, ...]],
        cache: Any = None,
    ) -> list[CachedPrefix]:
        """One pass computing ``prompts``, which all start with ``base``'s first ``m`` ids
        (``m == 0``: from scratch): each row is ``base[:m]`` (cached), its own rest
        left-padded, so every row's last position is real. Returns each prompt's entry;
        with ``cache`` given, the pass runs in it and keeps the rows as they are (no
        entries are cut out: ``keys``/``values`` are left empty)."""
        from transformers import DynamicCache

        rests = [p[m:] for p in prompts]
        n, width = len(prompts), max(len(r) for r in rests)
        input_ids = torch.full((n, width), self.pad_id, dtype=torch.long)  # [n, W]
        own = torch.zeros((n, width), dtype=torch.long)  # [n, W], 0 = padding
        for i, r in enumerate(rests):
            input_ids[i, width - len(r) :] = torch.tensor(r)
            own[i, width - len(r) :] = 1
        input_ids, own = input_ids.to(self.device), own.to(self.device)
        positions = m + (own.cumsum(-1) - 1).clamp(min=0)  # [n, W]; real tokens count on from m
        mask = torch.cat([own.new_ones((n, m)), own], dim=1)  # [n, m + W]
        keep = cache is None
        if cache is None:
            cache = DynamicCache(config=self.model.config)
        if m:
            assert base is not None
            for li, layer in enumerate(cache.layers):  # [n, h, m, d], expanded, not copied
                k, v = base.keys[li][:, :, :m], base.values[li][:, :, :m]
                layer.update(k.expand(n, -1, -1, -1), v.expand(n, -1, -1, -1))
            self._count("cached_tokens", m * n)
        self._count("prefill_tokens", sum(map(len, rests)))
        logits = self._forward(
            cache, input_ids=input_ids, attention_mask=mask, position_ids=positions
        )
        layers = list(cache.layers) if keep else []
        out = []
        for i, (p, r) in enumerate(zip(prompts, rests, strict=True)):
            start = m + width - len(r)  # where row i's own positions begin

            def cut(x: torch.Tensor, i: int = i, start: int = start) -> torch.Tensor:
                row = x[i : i + 1]  # [1, h, m + W, d]
                if m == 0:
                    return row[:, :, start:]  # a view of the pass's cache
                return torch.cat([row[:, :, :m], row[:, :, start:]], dim=2)

            out.append(
                CachedPrefix(
                    p,
                    [cut(layer.keys) for layer in layers],
                    [cut(layer.values) for layer in layers],
                    logits[i],
                )
            )
        return out

    def _assemble(
        self, rows: list[Row], entries: list[CachedPrefix], cache: Any, *, built: bool = False
    ) -> tuple[_Batch, torch.Tensor]:
        """The batch whose row i continues ``entries[i]`` (prompts: each has its logits);
        ``built``: ``cache`` already holds exactly these rows (the pass that computed them)."""
        width = max(e.length for e in entries)
        if built:
            logits = torch.stack([_logits(e) for e in entries])
        else:
            distinct = list(dict.fromkeys(entries))  # hashed by identity
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
            logits = torch.stack([_logits(e) for e in distinct])  # [n, V]
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
                self._remember_row(batch, i)
                self.on_finish(row)
        batch.tokens = torch.tensor(tokens, device=self.device)
        batch.select(keep)

    def _remember_row(self, batch: _Batch, i: int) -> None:
        """Cache finished row ``i``'s computed positions (its prompt and every sampled token
        but the last, which was never fed): an agent's next prompt usually starts so."""
        row = batch.rows[i]
        n = int(batch.next_pos[i])
        if n > self.prompts.max_positions or not _mergeable(batch.cache):
            return
        ids = tuple(row.prompt_ids) + tuple(row.ids[: n - len(row.prompt_ids)])
        layers = batch.cache.layers  # row i's positions are the last n columns
        keys = [layer.keys[i : i + 1, :, -n:].clone() for layer in layers]
        values = [layer.values[i : i + 1, :, -n:].clone() for layer in layers]
        self.prompts.add(CachedPrefix(ids, keys, values, None))

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
