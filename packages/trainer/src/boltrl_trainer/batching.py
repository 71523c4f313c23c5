"""Feeding transitions to the policy loss: rollout indexing, micro-batches by token
budget, and per-token log-probs / entropy from logits.

Torch is imported inside the functions that need it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from boltrl.errors import InvalidInput
from boltrl.records import Transition

if TYPE_CHECKING:
    import torch

__all__ = [
    "entropy_from_logits",
    "index_rollouts",
    "pack_microbatches",
    "pack_prefix_microbatches",
    "pack_shared_microbatches",
    "shared_prefix",
    "token_logprobs",
]


def token_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """Log-probability of each target id: ``[..., V]`` logits, ``[...]`` ids -> ``[...]``.

    ``temperature`` must be the sampling temperature: the gateway records logprobs of the
    tempered distribution, and the ratio compares like with like only when the trainer
    divides by the same value (a forgotten temperature shows as ``logprob_mismatch``).
    Computed as ``logit - logsumexp`` in float32, without materializing a log-softmax.
    """
    import torch

    logits = logits.float()
    if temperature != 1.0:
        if not temperature > 0:
            raise InvalidInput(f"temperature: must be > 0 (got {temperature!r})")
        logits = logits / temperature
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the softmax over the last dim: ``[..., V]`` -> ``[...]`` (float32)."""
    import torch

    logits = logits.float()
    logp = torch.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)


def index_rollouts(
    transitions: Sequence[Transition],
) -> tuple[list[int], list[int]]:
    """Rollout index of each transition (0..R-1, first-seen order) and, per rollout, its
    number of trained tokens (``sum(action_mask)``): the ``rollout_index`` and
    ``rollout_tokens`` that ``policy_loss`` takes, computed once per batch."""
    index_of: dict[str, int] = {}
    rows: list[int] = []
    tokens: list[int] = []
    for t in transitions:
        i = index_of.setdefault(t.rollout_id, len(index_of))
        if i == len(tokens):
            tokens.append(0)
        rows.append(i)
        tokens[i] += sum(t.action_mask)
    return rows, tokens


def pack_microbatches(
    items: Sequence[Transition] | Sequence[int], max_tokens: int
) -> list[list[int]]:
    """Indices of ``items`` packed into micro-batches of at most ``max_tokens`` padded tokens.

    ``items`` are transitions (length = state + action) or sequence lengths. A
    micro-batch costs ``rows * longest row`` (rows are padded to the longest); sequences
    are taken longest first, so rows of similar length share a micro-batch. A sequence
    longer than ``max_tokens`` gets a micro-batch of its own. Every index appears once.
    """
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise InvalidInput(f"max_tokens: must be a positive integer (got {max_tokens!r})")
    lengths = [x if isinstance(x, int) else len(x.state) + len(x.action) for x in items]
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    longest = 0
    for i in order:
        if batches and (len(batches[-1]) + 1) * longest <= max_tokens:
            batches[-1].append(i)
        else:
            batches.append([i])
            longest = lengths[i]
    return batches


def pack_shared_microbatches(
    items: Sequence[Transition], max_tokens: int, min_shared: int = 16
) -> list[list[int]]:
    """Like ``pack_microbatches`` for a forward pass that computes each distinct state
    once, and the prefix all of a micro-batch's states share (when ``>= min_shared``
    tokens) once before them (``boltrl_trainer._shared_prompt``): a micro-batch costs
    ``shared_cost``, ``shared + distinct states * (longest state - shared) + rows *
    longest action`` padded positions.

    Rows with the same state (a GRPO group's samples of one prompt) are kept together, and
    whole groups are taken in one of two orders, longest state first or in the order of
    their states' token ids (neighbours then share the longest prefixes: an agent's
    system prompt and tools, a conversation's earlier turns); the cheaper packing is
    kept. A group is split across micro-batches only when it alone exceeds ``max_tokens``
    (then each part pays the state once). A row whose state plus action exceeds
    ``max_tokens`` gets a micro-batch of its own. Every index appears once.
    """
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise InvalidInput(f"max_tokens: must be a positive integer (got {max_tokens!r})")
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, t in enumerate(items):
        groups.setdefault(tuple(t.state), []).append(i)
    orders = [sorted(groups, key=lambda s: -len(s)), sorted(groups)]
    packed = [_pack_groups(items, groups, order, max_tokens, min_shared) for order in orders]
    return min(packed, key=lambda tb: tb[0])[1]


def shared_cost(items: Sequence[Transition], batch: Sequence[int], min_shared: int = 16) -> int:
    """Padded positions of ``batch`` in the shared forward (``pack_shared_microbatches``)."""
    states = list(dict.fromkeys(tuple(items[i].state) for i in batch))
    c = shared_prefix(states)
    c = c if c >= min_shared else 0
    longest = max(len(s) for s in states)
    return c + len(states) * (longest - c) + len(batch) * max(len(items[i].action) for i in batch)


def _pack_groups(
    items: Sequence[Transition],
    groups: dict[tuple[int, ...], list[int]],
    order: list[tuple[int, ...]],
    max_tokens: int,
    min_shared: int,
) -> tuple[int, list[list[int]]]:
    """Greedy packing of whole groups in ``order``; returns (total cost, micro-batches)."""
    batches: list[list[int]] = []
    # per open micro-batch: its first state, the prefix its states share, distinct
    # states, longest state, rows, longest action
    first: tuple[int, ...] = ()
    c = d = p = b = a = 0

    def cost(c: int, d: int, p: int, b: int, a: int) -> int:
        c = c if c >= min_shared else 0
        return c + d * (p - c) + b * a

    for state in order:
        rows = sorted(groups[state], key=lambda i: -len(items[i].action))
        s_len, a_max = len(state), len(items[rows[0]].action)
        cw = min(c, shared_prefix([first, state])) if b else s_len - 1
        whole = cost(cw, d + 1, max(p, s_len), b + len(rows), max(a, a_max))
        if batches and whole > max_tokens:  # the group does not fit whole: start afresh
            c = d = p = b = a = 0
        for i in rows:
            na = len(items[i].action)
            new_state = b == 0 or i == rows[0]
            if b > 0:
                cn = min(c, shared_prefix([first, state])) if new_state else c
                n = cost(cn, d + new_state, max(p, s_len), b + 1, max(a, na))
                if n <= max_tokens:
                    batches[-1].append(i)
                    c, d, p, b, a = cn, d + new_state, max(p, s_len), b + 1, max(a, na)
                    continue
            batches.append([i])
            first, c, d, p, b, a = state, s_len - 1, 1, s_len, 1, na
    return sum(shared_cost(items, bt, min_shared) for bt in batches), batches


def shared_prefix(states: Sequence[Sequence[int]]) -> int:
    """Length of the prefix every state of ``states`` shares (0 for fewer than two), kept
    short of each state's last token, whose logits predict the first action token."""
    if len(states) < 2:
        return 0
    first = states[0]
    n = min(len(s) for s in states) - 1
    for s in states[1:]:
        k = 0
        while k < n and s[k] == first[k]:
            k += 1
        n = k
    return max(n, 0)


def pack_prefix_microbatches(
    items: Sequence[Transition], max_tokens: int, min_shared: int
) -> list[list[int]]:
    """Like ``pack_microbatches`` for a forward pass that runs the prompt prefix all rows of
    a micro-batch share once (``SFTBackend``, when that prefix is ``>= min_shared`` tokens):
    a micro-batch costs ``shared + rows * (longest row - shared)`` positions.

    Rows are put in the order of their states' token ids and cut into families wherever
    two neighbours share fewer than ``min_shared`` tokens (a multi-agent episode's writer
    calls, which share the system prompt and schema, apart from its checker calls, which
    share another); each family is packed on its own, in that order, and the rows that
    share with no other are packed longest first. Of that packing, every row longest first
    by this cost, and ``pack_microbatches``'s (cut by padded size, which at times pads
    less), the cheapest is kept; ties keep the first. Each keeps a micro-batch within
    ``max_tokens`` by that cost, a row longer than ``max_tokens`` gets one of its own, and
    every index appears once.
    """
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise InvalidInput(f"max_tokens: must be a positive integer (got {max_tokens!r})")
    lengths = [len(t.state) + len(t.action) for t in items]

    def cost(rows: int, longest: int, shared: int) -> int:
        shared = shared if shared >= min_shared else 0
        return shared + rows * (longest - shared)

    def priced(batch: list[int]) -> int:
        longest = max(lengths[i] for i in batch)
        return cost(len(batch), longest, shared_prefix([items[i].state for i in batch]))

    def pack(order: list[int]) -> tuple[int, list[list[int]]]:
        """Greedy in ``order``: a row joins the open micro-batch while the cost fits."""
        batches: list[list[int]] = []
        total = longest = shared = 0
        for i in order:
            if batches:
                first = items[batches[-1][0]].state
                s = min(shared, shared_prefix([first, items[i].state]))
                n = max(longest, lengths[i])
                if cost(len(batches[-1]) + 1, n, s) <= max_tokens:
                    batches[-1].append(i)
                    longest, shared = n, s
                    continue
                total += cost(len(batches[-1]), longest, shared)
            batches.append([i])
            longest, shared = lengths[i], len(items[i].state) - 1
        if batches:
            total += cost(len(batches[-1]), longest, shared)
        return total, batches

    by_state = sorted(range(len(items)), key=lambda i: items[i].state)
    families: list[list[int]] = []
    for i in by_state:
        if (
            families
            and shared_prefix([items[families[-1][-1]].state, items[i].state]) >= min_shared
        ):
            families[-1].append(i)
        else:
            families.append([i])
    total, batches = 0, list[list[int]]()
    alone = [i for f in families if len(f) == 1 for i in f]
    for part in [f for f in families if len(f) > 1] + [sorted(alone, key=lambda i: -lengths[i])]:
        c, b = pack(part)
        total, batches = total + c, batches + b
    candidates = [(total, batches), pack(sorted(range(len(items)), key=lambda i: -lengths[i]))]
    padded = pack_microbatches(items, max_tokens)  # cut by padded size: less padding at times
    candidates.append((sum(priced(b) for b in padded), padded))
    return min(candidates, key=lambda c: c[0])[1]
