"""TransformersBackend on the tiny random model: token truth, batching, stops, tools, weights."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from backend_util import Forced, assert_generation_truth, chat

from boltrl.errors import BackendUnavailable, InvalidInput
from boltrl.gateway.backend import Backend, Generation, GenerationRequest
from boltrl.records import JSON
from boltrl_trainer.models import SMOLLM2_CHAT_TEMPLATE, load_model
from boltrl_trainer.serving import TransformersBackend

pytestmark = pytest.mark.usefixtures("no_backend_errors")


@pytest.fixture(scope="module")
def backend(tiny_model_path: Path) -> Iterator[TransformersBackend]:
    b = TransformersBackend(str(tiny_model_path), max_tokens=24, batch_window_s=0.05, seed=0)
    yield b
    b.close()


def test_is_a_backend(backend: TransformersBackend) -> None:
    assert isinstance(backend, Backend)
    assert backend.tokenizer.chat_template == SMOLLM2_CHAT_TEMPLATE
    assert backend.policy_version == 0


def test_greedy_reply_matches_hf_generate(backend: TransformersBackend) -> None:
    req = chat("What is 2 + 3?", temperature=0, max_tokens=12)
    gen = backend.generate_sync(req)
    assert_generation_truth(backend, req, gen)
    assert gen.response_token_ids is not None and gen.prompt_token_ids is not None
    with torch.no_grad():
        out = backend.model.generate(
            torch.tensor([gen.prompt_token_ids]),
            attention_mask=torch.ones(1, len(gen.prompt_token_ids), dtype=torch.long),
            do_sample=False,
            max_new_tokens=12,
        )
    assert out[0, len(gen.prompt_token_ids) :].tolist() == gen.response_token_ids
    assert gen.finish_reason == "length"
    assert gen.text == backend.tokenizer.decode(gen.response_token_ids, skip_special_tokens=True)
    assert gen.template_hash is not None and len(gen.template_hash) == 64
    assert (gen.policy_version, gen.model, gen.tool_calls) == (0, backend.model_name, [])


def test_batched_requests_keep_token_truth(backend: TransformersBackend) -> None:
    """Concurrent requests of different lengths and settings share batches, and each row
    computes what it would alone: logprobs match an unpadded forward pass within 1e-4."""
    settings = [(0.0, 1.0), (0.7, 1.0), (1.3, 1.0), (1.0, 0.9), (0.0, 1.0), (0.5, 0.5)]
    reqs = [
        chat("tell me " * (1 + 9 * i), temperature=t, top_p=p, max_tokens=6 + 3 * i)
        for i, (t, p) in enumerate(settings)
    ]
    before = backend.stats()

    async def run_all() -> list[Generation]:
        return await asyncio.gather(*(backend.generate(r) for r in reqs))

    gens = asyncio.run(run_all())
    after = backend.stats()
    assert after["requests"] - before["requests"] == len(reqs)
    assert after["batches"] - before["batches"] < len(reqs)  # really batched
    for req, gen in zip(reqs, gens, strict=True):
        assert_generation_truth(backend, req, gen)
    # greedy rows give the same ids batched as alone
    for i in (0, 4):
        alone = backend.generate_sync(reqs[i])
        assert alone.response_token_ids == gens[i].response_token_ids


def test_requests_join_a_running_loop(tiny_model_path: Path) -> None:
    """Continuous batching: requests that arrive mid-generation join the running loop (caches
    padded and merged, dead padding trimmed when rows leave) and keep token truth."""
    b = TransformersBackend(str(tiny_model_path), max_tokens=200, batch_window_s=0)
    try:
        long = chat("Hi", temperature=0, max_tokens=200)
        alone = b.generate_sync(long)
        joiners = [
            chat("A much longer question " * 12, temperature=0.9, max_tokens=5),
            chat("Medium question " * 4, temperature=1.0, top_p=0.8, max_tokens=40),
        ]
        before = b.stats()
        first = b.submit(long)
        while b.stats()["steps"] - before["steps"] < 5:
            time.sleep(0.001)
        later = [b.submit(r) for r in joiners]
        gens = [f.result(60) for f in later]
        assert not first.done()  # the joiners did not wait for the long reply
        gens.insert(0, first.result(60))
        after = b.stats()
        assert after["row_steps"] - before["row_steps"] > after["steps"] - before["steps"]
        assert gens[0].response_token_ids == alone.response_token_ids
        for req, gen in zip((long, *joiners), gens, strict=True):
            assert_generation_truth(b, req, gen)
    finally:
        b.close()


def test_seed_repeats_a_sample(backend: TransformersBackend) -> None:
    req = chat("Pick a word.", temperature=1.0, seed=123, max_tokens=10)
    first, second = backend.generate_sync(req), backend.generate_sync(req)
    assert first.response_token_ids == second.response_token_ids
    other = backend.generate_sync(chat("Pick a word.", temperature=1.0, seed=124, max_tokens=10))
    assert other.response_token_ids != first.response_token_ids


def test_max_tokens_ends_with_length(backend: TransformersBackend) -> None:
    gen = backend.generate_sync(chat("Count.", temperature=0, max_tokens=3))
    assert gen.finish_reason == "length"
    assert gen.response_token_ids is not None and len(gen.response_token_ids) == 3
    capped = backend.generate_sync(chat("Count.", temperature=0, max_tokens=10_000))
    assert capped.usage["completion_tokens"] == backend.max_tokens


def test_stop_string_cuts_the_text_not_the_ids(backend: TransformersBackend) -> None:
    req: JSON = {"temperature": 1.0, "seed": 5, "max_tokens": 20}
    full = backend.generate_sync(chat("Go on.", **req))
    assert full.response_token_ids is not None
    ids, tok = full.response_token_ids, backend.tokenizer

    def text(n: int) -> str:
        return str(tok.decode(ids[:n], skip_special_tokens=True))

    # a stop string that the reply first completes with its (k+1)-th token
    k = next(
        k
        for k in range(3, len(ids))
        if text(k + 1).startswith(text(k))
        and len(text(k + 1)) > len(text(k)) > 0
        and text(k + 1)[len(text(k)) - 1 :] not in text(k)
    )
    stop = text(k + 1)[len(text(k)) - 1 :]
    gen = backend.generate_sync(chat("Go on.", stop=[stop], **req))
    assert gen.finish_reason == "stop"
    assert gen.response_token_ids == ids[: k + 1]  # the ids keep what was sampled
    assert gen.text == text(k)[:-1]  # the text ends before the stop string


def test_eos_is_recorded_and_ends_the_reply(backend: TransformersBackend, forced: Forced) -> None:
    tok = backend.tokenizer
    script = [*tok.encode("Hello world", add_special_tokens=False), tok.eos_token_id]
    b = forced(script)
    req = chat("Say hello.", temperature=0.8)
    gen = b.generate_sync(req)
    assert gen.response_token_ids == script
    assert (gen.text, gen.finish_reason, gen.tool_calls) == ("Hello world", "stop", [])
    assert_generation_truth(b, req, gen)


def test_tool_call_is_parsed(backend: TransformersBackend, forced: Forced) -> None:
    tok = backend.tokenizer
    reply = 'Let me add.<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    script = [*tok.encode(reply, add_special_tokens=False), tok.eos_token_id]
    b = forced(script)
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    gen = b.generate_sync(chat("1+2?", tools=tools, temperature=0))
    assert gen.response_token_ids == script
    assert gen.finish_reason == "tool_calls"
    assert gen.text == "Let me add."
    (call,) = gen.tool_calls
    assert call["id"].startswith("call_")
    assert call == {
        "id": call["id"],
        "type": "function",
        "function": {"name": "add", "arguments": json.dumps({"a": 1, "b": 2})},
    }
    prompt = tok.decode(gen.prompt_token_ids)
    assert "<tools>\n" + json.dumps(tools[0]) + "\n</tools>" in prompt
    # with tool_choice="none" the reply stays text
    plain = b.generate_sync(chat("1+2?", tools=tools, tool_choice="none", temperature=0))
    assert (plain.text, plain.tool_calls, plain.finish_reason) == (reply, [], "stop")
    assert "<tools>" not in tok.decode(plain.prompt_token_ids)


def test_pause_waits_for_batches_and_the_set_version_is_served(
    backend: TransformersBackend,
) -> None:
    """The server's half of ``seams.weight_swap`` (test_update tests the whole swap)."""
    start = backend.policy_version
    with backend.paused():
        fut = backend.submit(chat("Hi", temperature=0, max_tokens=2))
        time.sleep(0.2)
        assert not fut.done()  # no batch starts while paused
        with torch.no_grad():
            backend.model.model.norm.weight.mul_(1.0)
        backend.set_policy_version(start + 1)  # inside the pause: no deadlock
    assert fut.result(30).policy_version == start + 1
    assert backend.policy_version == start + 1
    assert backend.generate_sync(chat("Hi", max_tokens=2)).policy_version == start + 1
    with pytest.raises(RuntimeError), backend.paused():
        raise RuntimeError("generation resumes after a failed swap")
    assert backend.generate_sync(chat("Hi", max_tokens=2)).policy_version == start + 1
    backend.set_policy_version(start)
    assert backend.policy_version == start


def test_load_weights_refuses_a_folder_without_trainable_weights(
    backend: TransformersBackend, tmp_path: Path
) -> None:
    with pytest.raises(InvalidInput, match=r"checkpoint: .* holds no trainable\.safetensors"):
        backend.load_weights(tmp_path)


def test_generate_does_not_block_the_event_loop(backend: TransformersBackend) -> None:
    async def main() -> int:
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.001)

        ticker = asyncio.create_task(tick())
        await backend.generate(chat("Hello", temperature=0, max_tokens=24))
        ticker.cancel()
        return ticks

    assert asyncio.run(main()) > 3


def test_bad_requests_fail_alone(backend: TransformersBackend) -> None:
    too_long = chat("word " * 5000)
    ok = chat("Hi", temperature=0, max_tokens=2)
    futures = [backend.submit(too_long), backend.submit(ok), backend.submit(chat("Hi", top_p=0))]
    with pytest.raises(InvalidInput, match="context holds 2048"):
        futures[0].result(30)
    assert futures[1].result(30).finish_reason == "length"
    with pytest.raises(InvalidInput, match="top_p"):
        futures[2].result(30)
    with pytest.raises(InvalidInput, match="messages"):
        backend.generate_sync(GenerationRequest(messages=[]))


def test_close_is_idempotent_and_final(tiny_model_path: Path) -> None:
    b = TransformersBackend(str(tiny_model_path))
    assert b.generate_sync(chat("Hi", max_tokens=1)).usage["completion_tokens"] == 1
    asyncio.run(b.aclose())
    b.close()
    with pytest.raises(BackendUnavailable):
        b.generate_sync(chat("Hi"))


def test_model_object_needs_its_tokenizer(tiny_model_path: Path) -> None:
    model, _ = load_model(tiny_model_path)
    with pytest.raises(ValueError, match="tokenizer"):
        TransformersBackend(model)
