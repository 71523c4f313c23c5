"""Real token streaming: TransformersBackend's text leaves the gateway as it is sampled.

Through the real gateway and the official openai client: a streamed call's text starts
arriving before the turn's last token is sampled, assembles to exactly the non-streamed
reply, and is recorded with the very ids and logprobs a non-streamed call records; a stop
string is never streamed, nor half a character.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gateway_util
import pytest
from backend_util import Forced
from gateway_util import responses_stream_deltas, running

from boltrl.gateway import Gateway
from boltrl.gateway.backend import Generation, GenerationRequest, StreamingBackend, stream_of
from boltrl.records import Attempt, LLMCall
from boltrl.store import open_store
from boltrl.store.base import Store
from boltrl.testing import ScriptedBackend
from boltrl_trainer.serving import TransformersBackend

pytestmark = pytest.mark.usefixtures("no_backend_errors")
MESSAGES = [{"role": "user", "content": "Tell me a story."}]


@pytest.fixture
def store() -> Iterator[Store]:
    s = open_store("memory://")
    yield s
    s.close()


client = functools.partial(gateway_util.client, timeout=60)  # the model samples under load


def _plain_and_streamed(
    store: Store,
    plain: tuple[TransformersBackend, Attempt],
    streamed: tuple[TransformersBackend, Attempt],
    kw: dict[str, Any],
) -> tuple[Any, list[Any], list[str]]:
    """One chat request made plainly through a gateway on ``plain``'s backend and streamed
    through one on ``streamed``'s (each for its rollout attempt): the plain reply, the
    streamed chunks and their text deltas."""
    (b1, a1), (b2, a2) = plain, streamed
    with Gateway(b1, store) as gw1, Gateway(b2, store) as gw2:
        reply = client(gw1.rollout_url(a1)).chat.completions.create(**kw)
        chunks = list(client(gw2.rollout_url(a2)).chat.completions.create(**kw, stream=True))
    deltas = [
        c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content
    ]
    return reply, chunks, deltas


def _call(store: Store, a: Attempt) -> LLMCall:
    (call,) = store.get(a.rollout_id).calls
    return call


def test_streamed_text_leaves_while_sampling_and_records_the_same_call(
    tiny_model_path: Path, store: Store
) -> None:
    backend = TransformersBackend(str(tiny_model_path), max_tokens=32)
    assert isinstance(backend, StreamingBackend)
    plain, streamed = running(store, 2)
    kw = {"model": "p", "messages": MESSAGES, "temperature": 1.0, "max_tokens": 32, "seed": 7}
    try:
        with Gateway(backend, store) as gw:
            reply = client(gw.rollout_url(plain)).chat.completions.create(**kw)  # type: ignore[call-overload]
            steps_at_first: int | None = None
            deltas: list[str] = []
            for chunk in client(gw.rollout_url(streamed)).chat.completions.create(  # type: ignore[call-overload]
                **kw, stream=True
            ):
                piece = chunk.choices[0].delta.content if chunk.choices else None
                if piece:
                    if steps_at_first is None:
                        steps_at_first = backend.stats()["steps"]
                    deltas.append(piece)
            steps_at_end = backend.stats()["steps"]
    finally:
        backend.close()
    a, b = _call(store, plain), _call(store, streamed)
    assert a.response_token_ids is not None and len(a.response_token_ids) == 32
    # the same turn, recorded the same way
    assert (b.prompt_token_ids, b.response_token_ids) == (a.prompt_token_ids, a.response_token_ids)
    assert b.response_logprobs == pytest.approx(a.response_logprobs, abs=1e-6)
    assert b.response == a.response
    assert "".join(deltas) == reply.choices[0].message.content == a.response["message"]["content"]
    # live: the first text left before the turn's forward passes were done
    assert steps_at_first is not None and steps_at_first < steps_at_end - 8, (
        steps_at_first,
        steps_at_end,
    )
    assert len(deltas) > 8


def _script(
    forced: Forced, text: str
) -> tuple[list[int], TransformersBackend, TransformersBackend]:
    """Two forced backends replying ``text`` + EOS (one each: a stop string leaves a forced
    backend's script mid-way)."""
    probe = forced([0])
    tok = probe.tokenizer
    ids = [*tok.encode(text, add_special_tokens=False), tok.eos_token_id]
    return ids, forced(ids), forced(ids)


def test_stop_strings_and_partial_characters_are_never_streamed(
    forced: Forced, store: Store
) -> None:
    text = "Once upon a time 🙂 a fox met a crow. THE END and then some more words"
    ids, one, two = _script(forced, text)
    plain, streamed = running(store, 2)
    kw = {"model": "p", "messages": MESSAGES, "temperature": 0, "stop": ["THE END"]}
    reply, chunks, deltas = _plain_and_streamed(store, (one, plain), (two, streamed), kw)
    expected = "Once upon a time 🙂 a fox met a crow. "
    assert reply.choices[0].message.content == expected == "".join(deltas)
    assert len(deltas) > 3
    assert not any("\ufffd" in d or "T" in d for d in deltas)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    a, b = _call(store, plain), _call(store, streamed)
    assert a.response_token_ids == b.response_token_ids and a.response == b.response
    assert b.response_token_ids is not None and b.response_token_ids != ids  # cut at the stop


def test_responses_api_streams_live(forced: Forced, store: Store) -> None:
    text = "The quick brown fox jumps over the lazy dog, twice over."
    ids, one, _ = _script(forced, text)
    (attempt,) = running(store, 1)
    with Gateway(one, store) as gw:
        events = list(
            client(gw.rollout_url(attempt)).responses.create(
                model="p", input="Say it.", temperature=0, stream=True
            )
        )
    deltas = responses_stream_deltas(events)
    assert "".join(deltas) == text and len(deltas) > 3
    final = events[-1].response  # type: ignore[union-attr]
    assert final.output_text == text
    call = _call(store, attempt)
    assert call.id == final.id and call.response_token_ids == ids


def test_text_before_a_tool_call_streams_and_the_call_follows(forced: Forced, store: Store) -> None:
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    reply = f"Let me add the two numbers for you. {call}"
    ids, one, two = _script(forced, reply)
    plain, streamed = running(store, 2)
    tool = {
        "type": "function",
        "function": {
            "name": "add",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            },
        },
    }
    kw = {"model": "p", "messages": MESSAGES, "temperature": 0, "tools": [tool]}
    r, chunks, deltas = _plain_and_streamed(store, (one, plain), (two, streamed), kw)
    assert "".join(deltas) == r.choices[0].message.content == "Let me add the two numbers for you."
    assert len(deltas) > 3 and not any("<" in d for d in deltas)
    calls = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
    (tc,) = r.choices[0].message.tool_calls or []
    assert calls[0].function is not None and calls[0].function.name == "add"
    assert "".join(d.function.arguments or "" for d in calls if d.function) == tc.function.arguments
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    a, b = _call(store, plain), _call(store, streamed)
    assert a.response_token_ids == b.response_token_ids == ids
    assert a.response["message"]["content"] == b.response["message"]["content"]


def test_the_sessions_sampling_wrapper_streams_live(tiny_model_path: Path, store: Store) -> None:
    """``PhaseSampling`` (what ``boltrl train`` / ``eval`` serve) streams when its backend
    does, with the phase's sampling forced on the call."""
    from boltrl_trainer.session import PhaseSampling, Sampling

    inner = TransformersBackend(str(tiny_model_path), max_tokens=64)
    wrapped = PhaseSampling(inner, Sampling(temperature=1.0, top_p=1.0, max_tokens=24))
    assert isinstance(wrapped, StreamingBackend)
    (attempt,) = running(store, 1)
    try:
        with Gateway(wrapped, store) as gw:
            steps_at_first = None
            deltas = []
            for chunk in client(gw.rollout_url(attempt)).chat.completions.create(
                model="p", messages=MESSAGES, temperature=0, max_tokens=60, seed=7, stream=True
            ):
                if chunk.choices and chunk.choices[0].delta.content:
                    steps_at_first = steps_at_first or inner.stats()["steps"]
                    deltas.append(chunk.choices[0].delta.content)
            steps_at_end = inner.stats()["steps"]
        forced = inner.generate_sync(
            GenerationRequest(messages=MESSAGES, temperature=1.0, max_tokens=24, seed=7)
        )
    finally:
        inner.close()
    call = _call(store, attempt)
    # the phase's temperature 1 and 24-token cap, not the agent's 0 and 60
    assert call.response_token_ids == forced.response_token_ids
    assert call.response_token_ids is not None and len(call.response_token_ids) == 24
    assert "".join(deltas) == forced.text == call.response["message"]["content"]
    assert steps_at_first is not None and steps_at_first < steps_at_end - 8
    assert wrapped.busy_s > 0


def test_stream_of_serves_every_backend() -> None:
    """A backend without streaming (the scripted one) streams through ``stream_of`` as
    one ``Generation``; the gateway then streams it the way it always did."""
    backend = ScriptedBackend(["hello there"])
    assert not isinstance(backend, StreamingBackend)
    req = GenerationRequest(messages=[{"role": "user", "content": "hi"}])

    async def drain() -> list[str | Generation]:
        try:
            return [e async for e in stream_of(backend, req)]
        finally:
            await backend.aclose()

    out = asyncio.run(drain())
    assert len(out) == 1 and isinstance(out[0], Generation) and out[0].text == "hello there"
