"""The Agents SDK adapter's pure conversions, on the shapes the SDK hands a processor."""

from __future__ import annotations

from openai.types.responses import Response

from boltrl_openai_agents import _convert as cv

CALL = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}


def test_responses_input_items_become_the_gateways_chat_messages() -> None:
    items = [
        {
            "role": "user",
            "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}],
        },
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "hm"}],
        },
        {"type": "function_call", "call_id": "c1", "name": "add", "arguments": '{"a": 1}'},
        {"type": "function_call", "call_id": "c2", "name": "add", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "1"},
        {"role": "developer", "content": "be brief"},
    ]
    c2 = {"id": "c2", "type": "function", "function": {"name": "add", "arguments": "{}"}}
    assert cv.input_messages(items, "sys") == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "a\nb"},
        {"role": "assistant", "content": "hm", "tool_calls": [CALL, c2]},
        {"role": "tool", "tool_call_id": "c1", "content": "1"},
        {"role": "system", "content": "be brief"},
    ]
    assert cv.input_messages("hi", None) == [{"role": "user", "content": "hi"}]


def test_generation_output_of_a_plain_and_of_a_streamed_chat_call() -> None:
    plain = [
        {"content": None, "refusal": None, "role": "assistant", "audio": None, "tool_calls": [CALL]}
    ]
    assert cv.generation_output(plain) == (
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        None,
    )
    streamed = [
        {
            "id": cv.FAKE_ID,
            "object": "response",
            "output": [
                {
                    "type": "message",
                    "id": cv.FAKE_ID,
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "ok"}],
                    "provider_data": {"response_id": "chatcmpl-9"},
                },
                {"type": "function_call", "call_id": "c1", "name": "add", "arguments": '{"a": 1}'},
            ],
        }
    ]
    assert cv.generation_output(streamed) == (
        {"role": "assistant", "content": "ok", "tool_calls": [CALL]},
        "chatcmpl-9",
    )
    assert cv.generation_output(None) == (None, None)


def test_a_responses_object_gives_its_message_and_instructions() -> None:
    resp = Response.model_validate(
        {
            "id": "resp_1",
            "object": "response",
            "created_at": 0,
            "model": "m",
            "instructions": [{"role": "developer", "content": "sys"}],
            "output": [
                {
                    "type": "function_call",
                    "call_id": "c1",
                    "name": "add",
                    "arguments": '{"a": 1}',
                    "id": "fc_1",
                    "status": "completed",
                }
            ],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
        }
    )
    assert cv.get(resp, "id") == "resp_1"
    assert cv.instructions_text(cv.get(resp, "instructions")) == "sys"
    assert cv.output_message(cv.get(resp, "output")) == {
        "role": "assistant",
        "content": None,
        "tool_calls": [CALL],
    }


def test_tool_calls_are_matched_once_by_name_then_arguments() -> None:
    calls = [
        {"id": "a", "name": "add", "arguments": "{}"},
        {"id": "b", "name": "add", "arguments": '{"a": 1}'},
    ]
    used: set[int] = set()
    assert cv.match_tool_call(calls, used, "add", '{"a": 1}') == calls[1]
    assert cv.match_tool_call(calls, used, "add", '{"a": 1}') == calls[0]
    assert cv.match_tool_call(calls, used, "add", "{}") is None
    assert cv.match_tool_call(calls, set(), "mul", "{}") is None


def test_small_fields() -> None:
    assert cv.parse_arguments('{"a": 1}') == {"a": 1}
    assert cv.parse_arguments("not json") == "not json"
    assert cv.jsonable({"a": [1]}) == {"a": [1]}
    assert cv.jsonable({1, 2}) in ("{1, 2}", "{2, 1}")
    assert cv.span_error({"message": "Error running tool", "data": {"error": "boom"}}) == (
        "Error running tool: boom"
    )
    assert cv.span_error({"message": "failed", "data": None}) == "failed"
    assert cv.span_error(None) is None
    assert cv.handoff_tool_name("Math Agent!") == "transfer_to_math_agent_"
    assert cv.span_time("2026-01-01T00:00:00+00:00") == 1767225600.0
