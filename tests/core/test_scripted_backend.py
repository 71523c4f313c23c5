"""ScriptedBackend: deterministic replies, per-rollout scripts, token ids as documented."""

from __future__ import annotations

import asyncio
import json

import pytest

from boltrl.errors import BackendError
from boltrl.gateway.backend import Backend, GenerationRequest
from boltrl.testing import (
    SCRIPTED_LOGPROB,
    TEMPLATE_HASH,
    ScriptedBackend,
    render_prompt,
    render_reply,
)


def req(content: str = "hi", rollout_id: str | None = None, **kw: object) -> GenerationRequest:
    return GenerationRequest(
        messages=[{"role": "user", "content": content}], rollout_id=rollout_id, **kw
    )


def gen(backend: ScriptedBackend, request: GenerationRequest):  # type: ignore[no-untyped-def]
    return asyncio.run(backend.generate(request))


def test_is_a_backend() -> None:
    assert isinstance(ScriptedBackend(["x"]), Backend)


def test_text_reply_token_ids_are_utf8_bytes_of_the_rendered_strings() -> None:
    b = ScriptedBackend(["héllo"], policy_version=3)
    r = req("ça va")
    g = gen(b, r)
    prompt = "<|user|>ça va\n<|assistant|>"
    assert render_prompt(r) == prompt
    assert g.model_dump() == {
        "text": "héllo",
        "tool_calls": [],
        "finish_reason": "stop",
        "prompt_token_ids": list(prompt.encode()),
        "response_token_ids": list("héllo".encode()),
        "response_logprobs": [SCRIPTED_LOGPROB] * len("héllo".encode()),
        "policy_version": 3,
        "template_hash": TEMPLATE_HASH,
        "model": "scripted",
        "demonstration": None,
        "usage": {
            "prompt_tokens": len(prompt.encode()),
            "completion_tokens": 6,
            "total_tokens": len(prompt.encode()) + 6,
        },
    }


def test_tool_call_reply_ids_and_rendering() -> None:
    b = ScriptedBackend([{"tool_calls": [{"name": "add", "arguments": {"a": 1}}, {"name": "x"}]}])
    g = gen(b, req())
    assert g.text is None and g.finish_reason == "tool_calls"
    assert g.tool_calls == [
        {
            "id": "call_0_0",
            "type": "function",
            "function": {"name": "add", "arguments": '{"a": 1}'},
        },
        {"id": "call_0_1", "type": "function", "function": {"name": "x", "arguments": "{}"}},
    ]
    rendered = '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
    rendered += '<tool_call>{"name": "x", "arguments": {}}</tool_call>'
    assert render_reply(None, g.tool_calls) == rendered
    assert g.response_token_ids == list(rendered.encode())


def test_next_prompt_extends_previous_prompt_and_reply() -> None:
    b = ScriptedBackend([{"content": "ok", "tool_calls": [{"name": "f", "arguments": {}}]}, "done"])
    r1 = req("go", "ro-1", tools=[{"type": "function", "function": {"name": "f"}}])
    g1 = gen(b, r1)
    assistant = {"role": "assistant", "content": g1.text, "tool_calls": g1.tool_calls}
    tool = {"role": "tool", "tool_call_id": "call_0_0", "content": "42"}
    r2 = r1.model_copy(update={"messages": [*r1.messages, assistant, tool]})
    g2 = gen(b, r2)
    assert g2.text == "done"
    first = (g1.prompt_token_ids or []) + (g1.response_token_ids or [])
    assert g2.prompt_token_ids is not None and g2.prompt_token_ids[: len(first)] == first


def test_script_restarts_per_rollout_and_repeats_last() -> None:
    b = ScriptedBackend(["a", "b"])
    texts = [gen(b, req(rollout_id=rid)).text for rid in ("r1", "r1", "r2", "r1", None, None)]
    assert texts == ["a", "b", "a", "b", "a", "b"]
    assert b.calls == 6
    b.reset()
    assert gen(b, req(rollout_id="r1")).text == "a"


def test_exhausted_raise() -> None:
    b = ScriptedBackend(["a"], exhausted="raise")
    gen(b, req())
    with pytest.raises(BackendError, match="no reply #2"):
        gen(b, req())


def test_callable_and_exception_replies() -> None:
    def echo(r: GenerationRequest) -> str:
        return "echo: " + r.messages[-1]["content"]

    b = ScriptedBackend([echo, BackendError("boom"), {"tool_calls": [{"name": "t", "id": "c1"}]}])
    assert gen(b, req("x")).text == "echo: x"
    with pytest.raises(BackendError, match="boom"):
        gen(b, req())
    assert gen(b, req()).tool_calls[0]["id"] == "c1"
    only = ScriptedBackend(lambda r: {"content": str(len(r.messages))})
    assert gen(only, req()).text == "1"


def test_stop_and_max_tokens() -> None:
    b = ScriptedBackend(["hello world. more"])
    g = gen(b, req(stop=[".", "zz"]))
    assert (g.text, g.finish_reason) == ("hello world", "stop")
    g = gen(b, req(max_tokens=5))
    assert (g.text, g.finish_reason, g.response_token_ids) == ("hello", "length", list(b"hello"))


def test_without_token_ids() -> None:
    g = gen(ScriptedBackend(["x"], with_token_ids=False), req())
    assert (g.prompt_token_ids, g.response_token_ids, g.response_logprobs) == (None, None, None)


@pytest.mark.parametrize(
    "replies, error",
    [
        ([], "must not be empty"),
        ([3], "replies\\[0\\]"),
        ([{"text": "x"}], "unknown keys"),
        ([{"tool_calls": [{"arguments": {}}]}], "needs a string 'name'"),
    ],
)
def test_bad_scripts_are_refused(replies: list[object], error: str) -> None:
    with pytest.raises((ValueError, TypeError), match=error):
        ScriptedBackend(replies)  # type: ignore[arg-type]


def test_tools_rendered_canonically() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"b": 1, "a": 2}}}]
    assert render_prompt(req(tools=tools)).startswith(
        "<|tools|>" + json.dumps(tools, sort_keys=True) + "\n"
    )
