"""32 concurrent rollouts through one gateway: no call lost, none misattributed."""

from __future__ import annotations

import asyncio

import openai
from gateway_util import running, serve

from boltrl.gateway.backend import GenerationRequest
from boltrl.store import open_store
from boltrl.testing import ScriptedBackend

ROLLOUTS = 32
TURNS = 4


def _reply(request: GenerationRequest) -> str:
    # The answer names the rollout the backend was told and the user's own marker, so a
    # crossed wire shows up in the text the agent gets and in the record.
    return f"{request.rollout_id}|{request.messages[-1]['content']}"


async def _agent(base_url: str, index: int) -> list[tuple[str, str]]:
    """A small agent loop mixing chat, streamed chat and responses calls."""
    llm = openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0, timeout=30)
    seen = []
    messages: list = []
    for turn in range(TURNS):
        marker = f"agent{index}-turn{turn}"
        messages.append({"role": "user", "content": marker})
        kind = (index + turn) % 3
        if kind == 0:
            r = await llm.chat.completions.create(model="policy", messages=messages)
            rid, text = r.id, r.choices[0].message.content or ""
        elif kind == 1:
            stream = await llm.chat.completions.create(
                model="policy", messages=messages, stream=True
            )
            parts, rid = [], ""
            async for chunk in stream:
                rid = chunk.id
                if chunk.choices:
                    parts.append(chunk.choices[0].delta.content or "")
            text = "".join(parts)
        else:
            resp = await llm.responses.create(model="policy", input=messages)
            rid, text = resp.id, resp.output_text
        messages.append({"role": "assistant", "content": text})
        seen.append((rid, text))
    await llm.close()
    return seen


def test_concurrent_rollouts_keep_their_calls() -> None:
    store = open_store("memory://")
    backend = ScriptedBackend(_reply, delay_s=0.002)
    with serve(backend, store) as gw:
        attempts = running(store, ROLLOUTS)

        async def main() -> list[list[tuple[str, str]]]:
            return await asyncio.gather(
                *(_agent(gw.rollout_url(a), i) for i, a in enumerate(attempts))
            )

        results = asyncio.run(main())
    assert backend.calls == ROLLOUTS * TURNS
    for i, (attempt, seen) in enumerate(zip(attempts, results, strict=True)):
        rid = attempt.rollout_id
        assert [text for _, text in seen] == [f"{rid}|agent{i}-turn{t}" for t in range(TURNS)]
        calls = store.get(rid).calls
        assert [c.id for c in calls] == [call_id for call_id, _ in seen]
        for t, call in enumerate(calls):
            assert (call.rollout_id, call.attempt, call.status) == (rid, attempt.number, "ok")
            assert call.request["messages"][-1]["content"] == f"agent{i}-turn{t}"
            assert call.response["message"]["content"] == f"{rid}|agent{i}-turn{t}"
            assert len(call.request["messages"]) == 2 * t + 1
    total = sum(len(store.get(a.rollout_id).calls) for a in attempts)
    assert total == ROLLOUTS * TURNS
    store.close()
