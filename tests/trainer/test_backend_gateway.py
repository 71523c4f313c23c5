"""TransformersBackend behind the real gateway, driven by the official openai client.

Every call is recorded under its rollout with token truth: the recorded prompt ids are the
rendered prompt's, the recorded logprobs match a fresh forward pass, and the response the
client saw is what the recorded ids decode to.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import gateway_util
import pytest
from backend_util import Forced, assert_token_truth
from gateway_util import running

from boltrl.gateway import Gateway
from boltrl.records import JSON, Attempt, LLMCall
from boltrl.store import open_store
from boltrl.store.base import Store
from boltrl_trainer._chat import template_hash
from boltrl_trainer.serving import TransformersBackend

pytestmark = pytest.mark.usefixtures("no_backend_errors")
ADD_TOOL: JSON = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}


@pytest.fixture
def store() -> Iterator[Store]:
    s = open_store("memory://")
    yield s
    s.close()


@pytest.fixture(scope="module")
def backend(tiny_model_path: Path) -> Iterator[TransformersBackend]:
    b = TransformersBackend(str(tiny_model_path), max_tokens=16, batch_window_s=0.05)
    yield b
    b.close()


client = functools.partial(gateway_util.client, timeout=60)  # the model samples under load


def only_call(store: Store, rollout_id: str) -> LLMCall:
    (call,) = store.get(rollout_id).calls
    return call


def check_recorded(
    b: TransformersBackend, call: LLMCall, messages: list[JSON], temp: float, **kw: Any
) -> None:
    assert call.status == "ok"
    ids, lps = call.response_token_ids, call.response_logprobs
    assert_token_truth(b, messages, temp, call.prompt_token_ids, ids, lps, **kw)
    assert call.template_hash == template_hash(b.tokenizer.chat_template)
    assert (call.policy_version, call.model) == (b.policy_version, b.model_name)


def test_chat_calls_are_recorded_with_token_truth(
    backend: TransformersBackend, store: Store
) -> None:
    (plain, streamed) = running(store, 2)
    messages: list[JSON] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Name a colour."},
    ]
    with Gateway(backend, store) as gw:
        r = client(gw.rollout_url(plain)).chat.completions.create(
            model="policy", messages=messages, temperature=0.7, max_tokens=9, seed=3
        )
        chunks = list(
            client(gw.rollout_url(streamed)).chat.completions.create(
                model="policy", messages=messages, temperature=0.7, max_tokens=9, stream=True
            )
        )
    call = only_call(store, plain.rollout_id)
    assert r.id == call.id and r.choices[0].finish_reason == "length"
    assert call.response_token_ids is not None and len(call.response_token_ids) == 9
    text = backend.tokenizer.decode(call.response_token_ids, skip_special_tokens=True)
    assert r.choices[0].message.content == text == call.response["message"]["content"]
    assert r.usage is not None and r.usage.completion_tokens == 9
    check_recorded(backend, call, messages, 0.7)

    call = only_call(store, streamed.rollout_id)
    assert {c.id for c in chunks} == {call.id}
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == call.response["message"]["content"]
    check_recorded(backend, call, messages, 0.7)


def test_concurrent_rollouts_are_batched_and_attributed(
    backend: TransformersBackend, store: Store
) -> None:
    attempts = running(store, 6)
    before = backend.stats()

    def agent(i: int, attempt: Attempt, url: str) -> tuple[str, list[JSON]]:
        messages = [{"role": "user", "content": f"Rollout {i}: " + "go " * (3 * i)}]
        r = client(url).chat.completions.create(
            model="policy", messages=messages, temperature=1.0, max_tokens=4 + i
        )
        return r.id, messages

    with Gateway(backend, store) as gw, ThreadPoolExecutor(len(attempts)) as pool:
        futures = [pool.submit(agent, i, a, gw.rollout_url(a)) for i, a in enumerate(attempts)]
        results = [f.result() for f in futures]
    assert backend.stats()["batches"] - before["batches"] < len(attempts)
    for i, (attempt, (call_id, messages)) in enumerate(zip(attempts, results, strict=True)):
        call = only_call(store, attempt.rollout_id)
        assert call.id == call_id
        assert call.response_token_ids is not None and len(call.response_token_ids) == 4 + i
        check_recorded(backend, call, messages, 1.0)


def test_tool_calls_through_chat_and_responses(
    backend: TransformersBackend, forced: Forced, store: Store
) -> None:
    tok = backend.tokenizer
    reply = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    script = [*tok.encode(reply, add_special_tokens=False), tok.eos_token_id]
    b = forced(script)
    messages: list[JSON] = [{"role": "user", "content": "What is 2 + 3?"}]
    attempts = running(store, 3)
    with Gateway(b, store) as gw:
        urls = [gw.rollout_url(a) for a in attempts]
        r = client(urls[0]).chat.completions.create(
            model="policy", messages=messages, tools=[ADD_TOOL], temperature=0
        )
        chunks = list(
            client(urls[1]).chat.completions.create(
                model="policy", messages=messages, tools=[ADD_TOOL], temperature=0, stream=True
            )
        )
        resp = client(urls[2]).responses.create(
            model="policy",
            input="What is 2 + 3?",
            tools=[{"type": "function", **ADD_TOOL["function"]}],
            temperature=0,
        )

    (tc,) = r.choices[0].message.tool_calls or []
    assert r.choices[0].finish_reason == "tool_calls" and r.choices[0].message.content is None
    assert (tc.function.name, json.loads(tc.function.arguments)) == ("add", {"a": 2, "b": 3})
    call = only_call(store, attempts[0].rollout_id)
    assert call.response_token_ids == script  # the ids the model sampled, EOS included
    check_recorded(b, call, messages, 0.0, tools=[ADD_TOOL])

    deltas = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
    assert (
        "".join(d.function.arguments or "" for d in deltas if d.function) == tc.function.arguments
    )
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert only_call(store, attempts[1].rollout_id).response_token_ids == script

    (item,) = [o for o in resp.output if o.type == "function_call"]
    assert (item.name, json.loads(item.arguments)) == ("add", {"a": 2, "b": 3})
    call = only_call(store, attempts[2].rollout_id)
    assert call.id == resp.id and call.response_token_ids == script
    check_recorded(b, call, messages, 0.0, tools=call.request["tools"])
