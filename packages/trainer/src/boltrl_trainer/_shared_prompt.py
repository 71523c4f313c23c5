"""Action logprobs with each distinct state computed once, gradients included.

A GRPO group's samples share their prompt: a step of the demo trains 64 rows whose 47-token
states are only 8 distinct ones, so a plain padded forward spends most of its positions
(and, on a CPU, most of the update's time) recomputing identical prompts. Here a
micro-batch runs in two passes, as the sampler prefills (``_sampling``):

0. the prefix every distinct state of the micro-batch shares, once (when it is long
   enough to pay for a pass: an agent's system prompt and tool schemas open every call);
1. the distinct states (what follows that prefix), left-padded, one row each, on top of
   the prefix's keys and values, with a KV cache;
2. every row's action tokens (right-padded) on top of its state's keys and values,
   which ``index_select`` copies into the row: autograd sums the rows' gradients back
   into the one computation of the state (and of the prefix), so the loss and its
   gradient are those of the plain forward (up to float rounding; tested against it).

The logits predicting action token 0 come from the state's last position (pass 1), those
of token j > 0 from action position j - 1 (pass 2). Keys are stored after RoPE with each
row's own positions, so left padding changes nothing a row attends to.

Only for decoders whose cache is made of plain ``DynamicLayer``s (``usable``); other
models (sliding-window layers, logit post-processing) take the plain forward.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from boltrl.records import Transition
from boltrl_trainer._sampling import _cache_argument, _mergeable
from boltrl_trainer.batching import shared_prefix

if TYPE_CHECKING:
    import torch

__all__ = ["SharedInputs", "action_hidden", "shared_inputs", "usable"]


@dataclass
class SharedInputs:
    """A micro-batch laid out for the passes (shapes: C positions every state shares, D
    distinct states of at most C + P tokens, B rows, A = the longest action)."""

    common_ids: torch.Tensor  # [1, C]: the shared prefix (C = 0: no pass 0)
    prefix_ids: torch.Tensor  # [D, P]: each state after the shared prefix, left-padded
    prefix_mask: torch.Tensor  # [D, C + P], 0 = padding
    prefix_pos: torch.Tensor  # [D, P]
    group: torch.Tensor  # [B]: the row's state in 0..D-1
    suffix_ids: torch.Tensor  # [B, A - 1]: action tokens 0..A-2, right-padded
    suffix_mask: torch.Tensor  # [B, A - 1]
    suffix_pos: torch.Tensor  # [B, A - 1]


def usable(model: Any) -> bool:
    """Whether ``model`` takes the two-pass forward (see the module docstring)."""
    from transformers import DynamicCache

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    cfg = base.config
    if getattr(cfg, "final_logit_softcapping", None) or getattr(cfg, "logit_scale", None):
        return False
    return _mergeable(DynamicCache(config=cfg))


def shared_inputs(
    items: Sequence[Transition], pad_id: int, device: Any, min_shared: int = 16
) -> SharedInputs:
    """The passes' inputs for ``items`` (rows with equal states share one; the prefix all
    distinct states share runs once when it has ``min_shared`` tokens or more)."""
    import torch

    index: dict[tuple[int, ...], int] = {}
    group = [index.setdefault(tuple(t.state), len(index)) for t in items]
    states = list(index)
    c = shared_prefix(states)  # short of every state's last token
    c = c if c >= min_shared else 0
    width = max(len(s) for s in states) - c
    prefix_ids = torch.full((len(states), width), pad_id, dtype=torch.long)
    own = torch.zeros((len(states), width), dtype=torch.long)
    for i, s in enumerate(states):
        prefix_ids[i, width - len(s) + c :] = torch.tensor(s[c:])
        own[i, width - len(s) + c :] = 1
    prefix_pos = c + (own.cumsum(-1) - 1).clamp(min=0)
    prefix_mask = torch.cat([own.new_ones((len(states), c)), own], dim=1)
    common_ids = torch.tensor([states[0][:c]], dtype=torch.long).reshape(1, c)
    a_len = max(len(t.action) for t in items) - 1
    suffix_ids = torch.full((len(items), a_len), pad_id, dtype=torch.long)
    suffix_mask = torch.zeros((len(items), a_len), dtype=torch.long)
    suffix_pos = torch.zeros((len(items), a_len), dtype=torch.long)
    for i, t in enumerate(items):
        n = len(t.action) - 1
        if n > 0:
            suffix_ids[i, :n] = torch.tensor(t.action[:n])
            suffix_mask[i, :n] = 1
            suffix_pos[i, :n] = torch.arange(len(t.state), len(t.state) + n)
    return SharedInputs(
        common_ids.to(device),
        prefix_ids.to(device),
        prefix_mask.to(device),
        prefix_pos.to(device),
        torch.tensor(group, dtype=torch.long, device=device),
        suffix_ids.to(device),
        suffix_mask.to(device),
        suffix_pos.to(device),
    )


def action_hidden(model: Any, x: SharedInputs) -> torch.Tensor:
    """``[B, A, H]``: the decoder's hidden state at each position that predicts an action
    token (action token j of row i at ``[i, j]``); apply the LM head to get its logits."""
    import torch
    from transformers import DynamicCache

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    decoder = base.get_decoder()
    cache_arg = _cache_argument(decoder)
    cache = DynamicCache(config=base.config)
    c = x.common_ids.shape[1]
    if c:
        common = DynamicCache(config=base.config)
        decoder(input_ids=x.common_ids, use_cache=True, **{cache_arg: common})
        d = x.prefix_ids.shape[0]
        computed: list[Any] = list(common.layers)  # plain DynamicLayers (``usable``)
        fresh: list[Any] = list(cache.layers)
        for src, dst in zip(computed, fresh, strict=True):
            # [1, h, C, hd] -> [D, h, C, hd]: a view; autograd sums the states' gradients
            dst.update(src.keys.expand(d, -1, -1, -1), src.values.expand(d, -1, -1, -1))
    out = decoder(
        input_ids=x.prefix_ids,
        attention_mask=x.prefix_mask,
        position_ids=x.prefix_pos,
        use_cache=True,
        **{cache_arg: cache},
    )
    first: torch.Tensor = out.last_hidden_state[:, -1].index_select(0, x.group)  # [B, H]
    if x.suffix_ids.shape[1] == 0:
        return first[:, None]
    rows = DynamicCache(config=base.config)
    layers: list[Any] = list(cache.layers)  # plain DynamicLayers (``usable``)
    targets: list[Any] = list(rows.layers)
    for src, dst in zip(layers, targets, strict=True):
        dst.update(src.keys.index_select(0, x.group), src.values.index_select(0, x.group))
    mask = torch.cat([x.prefix_mask.index_select(0, x.group), x.suffix_mask], dim=1)
    rest = decoder(
        input_ids=x.suffix_ids,
        attention_mask=mask,
        position_ids=x.suffix_pos,
        use_cache=True,
        **{cache_arg: rows},
    ).last_hidden_state  # [B, A - 1, H]
    return torch.cat([first[:, None], rest], dim=1)
