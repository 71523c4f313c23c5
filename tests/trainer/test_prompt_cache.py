"""Prefix reuse in the sampling loop: a prompt is computed from the longest sequence the
backend computed before under the same weights (a shared system prompt, the previous turn
of an episode), and what it samples and records is what a fresh forward pass gives."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from backend_util import assert_generation_truth

from boltrl.gateway.backend import Generation, GenerationRequest
from boltrl_trainer._prompt_cache import CachedPrefix, PromptCache, common_prefix
from boltrl_trainer.serving import TransformersBackend

pytestmark = pytest.mark.usefixtures("no_backend_errors")

# ~120 tokens that open every call, as an agent's system prompt and tool list do
SYSTEM = "You are a careful assistant. " + " ".join(f"Rule {i}: be brief." for i in range(20))


def _req(*turns: str, temperature: float = 0.0, max_tokens: int = 12) -> GenerationRequest:
    messages = [{"role": "system", "content": SYSTEM}]
    for i, text in enumerate(turns):
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
    return GenerationRequest(messages=messages, temperature=temperature, max_tokens=max_tokens)


@pytest.fixture
def pair(tiny_model_path: Path) -> Iterator[tuple[TransformersBackend, TransformersBackend]]:
    """The same tiny model served with prefix reuse and without it."""
    cached = TransformersBackend(str(tiny_model_path), max_tokens=24, batch_window_s=0.1)
    plain = TransformersBackend(
        str(tiny_model_path), max_tokens=24, batch_window_s=0.1, cache_positions=0
    )
    yield cached, plain
    cached.close()
    plain.close()


def _same(a: Generation, b: Generation) -> None:
    assert a.prompt_token_ids == b.prompt_token_ids
    assert a.response_token_ids == b.response_token_ids
    assert a.response_logprobs is not None and b.response_logprobs is not None
    diff = torch.tensor(a.response_logprobs) - torch.tensor(b.response_logprobs)
    assert diff.abs().max() < 1e-5, diff


def test_calls_that_share_a_beginning_compute_it_once_and_keep_token_truth(
    pair: tuple[TransformersBackend, TransformersBackend],
) -> None:
    cached, plain = pair
    first = _req("What is 2 + 3?")
    gen1 = cached.generate_sync(first, 60)
    s1 = cached.stats()
    # another question after the same system prompt: only what follows it is computed
    second = _req("Name a color.")
    gen2 = cached.generate_sync(second, 60)
    s2 = cached.stats()
    # the next turn of the first episode: its prompt extends the first prompt (and as much
    # of the reply as the chat template renders the same)
    third = _req("What is 2 + 3?", "5", "And 4 + 4?")
    gen3 = cached.generate_sync(third, 60)
    s3 = cached.stats()

    assert gen1.prompt_token_ids and gen2.prompt_token_ids and gen3.prompt_token_ids
    shared = common_prefix(gen1.prompt_token_ids, gen2.prompt_token_ids)
    assert shared > 100
    assert s2["cached_tokens"] - s1["cached_tokens"] == shared
    assert s2["prefill_tokens"] - s1["prefill_tokens"] == len(gen2.prompt_token_ids) - shared
    reused = s3["cached_tokens"] - s2["cached_tokens"]
    rows = [g.prompt_token_ids + (g.response_token_ids or [])[:-1] for g in (gen1, gen2)]
    computed = [gen1.prompt_token_ids, gen2.prompt_token_ids, *rows]  # what the cache holds
    expected = max(common_prefix(c, gen3.prompt_token_ids) for c in computed)
    assert reused == min(expected, len(gen3.prompt_token_ids) - 1)
    assert reused >= len(gen1.prompt_token_ids) - 1 > shared  # more than the system prompt
    assert s3["prefill_tokens"] - s2["prefill_tokens"] == len(gen3.prompt_token_ids) - reused
    for req, gen in ((first, gen1), (second, gen2), (third, gen3)):
        assert_generation_truth(cached, req, gen)
        _same(gen, plain.generate_sync(req, 60))


def test_a_first_wave_computes_its_shared_beginning_once(
    pair: tuple[TransformersBackend, TransformersBackend],
) -> None:
    """Requests arriving together that share a beginning nobody computed yet (a new
    agent's first calls) compute it once, then each its own rest, sampled as without reuse."""
    cached, plain = pair
    reqs = [_req(f"Question {q}: what is {q} + {q}?", temperature=1.0) for q in range(5)]
    reqs += [_req("Question 0: what is 0 + 0?", temperature=1.0)]  # a group of two
    with cached.paused():
        before = cached.stats()
    gens = [f.result(60) for f in [cached.submit(r) for r in reqs]]
    after = cached.stats()
    assert after["batches"] - before["batches"] == 1
    prompts = [g.prompt_token_ids or [] for g in gens]
    beginning = min(common_prefix(prompts[0], p) for p in prompts[1:5])
    rests = sum(len(p) - beginning for p in prompts[:5])
    assert after["prefill_tokens"] - before["prefill_tokens"] == beginning + rests
    for req, gen in zip(reqs, gens, strict=True):
        assert_generation_truth(cached, req, gen)
    greedy = [r.model_copy(update={"temperature": 0.0}) for r in reqs[:3]]
    for req in greedy:
        _same(cached.generate_sync(req, 60), plain.generate_sync(req, 60))


def test_new_weights_empty_the_cache(
    pair: tuple[TransformersBackend, TransformersBackend],
) -> None:
    """Keys and values computed under old weights are never reused: ``paused()`` (inside
    which the trainer changes them) empties the cache, and the reply follows the new ones."""
    cached, plain = pair
    req = _req("What is 2 + 3?")
    cached.generate_sync(req, 60)
    with cached.paused(), plain.paused(), torch.no_grad():
        for model in (cached.model, plain.model):
            for p in model.parameters():
                p.mul_(1.5)
    before = cached.stats()
    gen = cached.generate_sync(req, 60)
    after = cached.stats()
    assert after["cached_tokens"] == before["cached_tokens"]
    assert after["prefill_tokens"] - before["prefill_tokens"] == len(gen.prompt_token_ids or [])
    assert_generation_truth(cached, req, gen)
    _same(gen, plain.generate_sync(req, 60))


# -- the cache on its own -----------------------------------------------------------------


def _entry(ids: tuple[int, ...], logits: bool = True) -> CachedPrefix:
    kv = [torch.zeros(1, 1, len(ids), 2)]
    return CachedPrefix(ids, kv, kv, torch.zeros(3) if logits else None)


@pytest.mark.parametrize(
    ("a", "b", "n"),
    [((), (1,), 0), ((1, 2, 3), (1, 2, 3), 3), ((1, 2, 3), (1, 2), 2), ((1, 2, 3), (1, 5, 3), 1)],
)
def test_common_prefix(a: tuple[int, ...], b: tuple[int, ...], n: int) -> None:
    assert common_prefix(a, b) == common_prefix(b, a) == n


def test_longest_prefix_leaves_the_last_position_to_compute() -> None:
    cache = PromptCache(100)
    cache.add(_entry((1, 2, 3, 4)))
    cache.add(_entry((1, 2, 9)))
    assert cache.longest((1, 2, 3, 4, 5))[1] == 4
    entry, n = cache.longest((1, 2, 3, 4))
    assert n == 3 and entry is not None and entry.ids == (1, 2, 3, 4)  # logits needed
    assert cache.longest((1, 2, 3, 4), whole=True)[1] == 4
    assert cache.longest((1, 2, 9, 9))[1] == 3
    assert cache.longest((7, 8)) == (None, 0)
    assert cache.exact((1, 2, 9)) is not None and cache.exact((1, 2)) is None


def test_budget_drops_the_least_recently_used() -> None:
    cache = PromptCache(10)
    cache.add(_entry((1, 2, 3, 4)))
    cache.add(_entry((5, 6, 7, 8)))
    cache.longest((1, 2, 3, 4, 0))  # (1, 2, 3, 4) is now the most recently used
    cache.add(_entry((9, 9, 9)))
    assert cache.positions == 7 and cache.exact((5, 6, 7, 8)) is None
    cache.add(_entry(tuple(range(11))))  # over the whole budget: not kept
    assert cache.positions == 7
    # a reply's row (no logits) never replaces the prompt with the same ids
    cache.add(_entry((9, 9, 9), logits=False))
    assert cache.exact((9, 9, 9)) is not None
    cache.clear()
    assert len(cache) == 0 and cache.positions == 0
