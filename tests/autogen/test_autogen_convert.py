"""The AutoGen adapter's pure conversions, on the payloads AutoGen's events carry."""

from __future__ import annotations

from boltrl_autogen import _convert as cv

CALL = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}


def test_agent_names_from_runtime_ids() -> None:
    team = "1fa72d24-3999-475c-b46d-0c32880e4d9d"
    assert cv.agent_name(f"solver_{team}/{team}") == "solver"
    assert cv.agent_name(f"SelectorGroupChatManager_{team}/{team}") == "SelectorGroupChatManager"
    assert cv.agent_name("assistant/default") == "assistant"
    assert cv.agent_name(None) is None
    assert cv.agent_name("") is None


def test_request_messages_in_the_gateways_normal_form() -> None:
    raw = [
        {"role": "system", "content": "s"},
        {
            "role": "user",
            "name": "user",
            "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
        },
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "content": "1", "tool_call_id": "c1"},
    ]
    assert cv.request_messages(raw) == [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "a\nb", "name": "user"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "content": "1", "tool_call_id": "c1"},
    ]
    assert cv.request_messages(None) is None


def test_completion_and_create_result_messages() -> None:
    completion = {
        "id": "chatcmpl-1",
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {
                    "role": "assistant",
                    "content": None,
                    "refusal": None,
                    "audio": None,
                    "tool_calls": [CALL],
                },
            }
        ],
    }
    assert cv.completion_id(completion) == "chatcmpl-1"
    assert cv.completion_message(completion) == {
        "role": "assistant",
        "content": None,
        "tool_calls": [CALL],
    }
    assert cv.completion_message({"choices": []}) is None
    streamed_calls = {
        "finish_reason": "function_calls",
        "content": [{"id": "c1", "name": "add", "arguments": '{"a": 1}'}],
        "thought": "let me add",
    }
    assert cv.create_result_message(streamed_calls) == {
        "role": "assistant",
        "content": "let me add",
        "tool_calls": [CALL],
    }
    assert cv.create_result_message({"content": "hi", "thought": None}) == {
        "role": "assistant",
        "content": "hi",
    }
    assert cv.tool_call_ids(cv.create_result_message(streamed_calls)) == ["c1"]
    assert cv.tool_call_ids(None) == []


def test_arguments() -> None:
    assert cv.parse_arguments('{"a": 1}') == {"a": 1}
    assert cv.parse_arguments("oops") == "oops"
    assert cv.parse_arguments({"a": {1}}) == "{'a': {1}}"
