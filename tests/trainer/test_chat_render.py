"""Chat rendering (native and fallback tool formats), tool-call parsing, and top-p draws."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from boltrl.records import JSON
from boltrl_trainer._chat import (
    TOOLS_PROMPT,
    fallback_messages,
    parse_tool_calls,
    render,
    template_hash,
    template_supports_tools,
)
from boltrl_trainer._sampling import _draw

TOOL: JSON = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
HISTORY: list[JSON] = [
    {"role": "developer", "content": "Use tools."},
    {"role": "user", "content": [{"type": "text", "text": "2+3"}, {"type": "text", "text": "?"}]},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2}'}},
            {"id": "c2", "type": "function", "function": {"name": "add", "arguments": "{}"}},
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "5"},
    {"role": "tool", "tool_call_id": "c2", "content": "0"},
]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_path: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path)


def test_fallback_messages_write_tool_history_in_hermes_form() -> None:
    assert fallback_messages(HISTORY, [TOOL]) == [
        {
            "role": "system",
            "content": "Use tools.\n\n" + TOOLS_PROMPT.format(tools=json.dumps(TOOL)),
        },
        {"role": "user", "content": "2+3?"},
        {
            "role": "assistant",
            "content": '<tool_call>\n{"name": "add", "arguments": {"a": 2}}\n</tool_call>\n'
            '<tool_call>\n{"name": "add", "arguments": {}}\n</tool_call>',
        },
        {
            "role": "user",
            "content": "<tool_response>\n5\n</tool_response>\n<tool_response>\n0\n</tool_response>",
        },
    ]
    # without a system message the tool block becomes one; without tools nothing is added
    assert fallback_messages([{"role": "user", "content": "hi"}], [TOOL])[0] == {
        "role": "system",
        "content": TOOLS_PROMPT.format(tools=json.dumps(TOOL)),
    }
    assert fallback_messages([{"role": "user", "content": "hi"}], None) == [
        {"role": "user", "content": "hi"}
    ]


def test_render_uses_the_fallback_for_smollm2(tokenizer: Any) -> None:
    text, digest = render(tokenizer, HISTORY, [TOOL], "auto")
    expected = tokenizer.apply_chat_template(
        fallback_messages(HISTORY, [TOOL]), tokenize=False, add_generation_prompt=True
    )
    assert text == expected and text.endswith("<|im_start|>assistant\n")
    assert digest == template_hash(tokenizer.chat_template)
    assert not template_supports_tools(tokenizer.chat_template)
    without, _ = render(tokenizer, HISTORY[:2], [TOOL], "none")
    assert "<tools>" not in without
    with pytest.raises(ValueError, match="messages"):
        render(tokenizer, [], None, None)


def test_render_lets_a_tool_aware_template_render_tools(tokenizer: Any) -> None:
    template = (
        "{% if tools %}TOOLS {{ tools | tojson }}|{% endif %}"
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% for c in m.tool_calls or [] %}"
        "[{{ c.function.name }} {{ c.function.arguments | tojson }}]{% endfor %}|{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    assert template_supports_tools(template)
    saved = tokenizer.chat_template
    tokenizer.chat_template = template
    try:
        text, digest = render(tokenizer, HISTORY[1:4], [TOOL], "auto")
    finally:
        tokenizer.chat_template = saved
    assert text == (
        f"TOOLS {json.dumps([TOOL])}|"
        "<user>2+3?|"
        '<assistant>[add {"a": 2}][add {}]|'  # arguments handed over as objects
        "<tool>5|"
        "<assistant>"
    )
    assert digest == template_hash(template)


def test_parse_tool_calls() -> None:
    content, calls = parse_tool_calls(
        'Sure.<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call> and '
        '<tool_call>\n{"name": "mul", "parameters": {"b": 2}}\n</tool_call>'
        "<tool_call>not json</tool_call>"
    )
    assert content == "Sure. and <tool_call>not json</tool_call>"
    assert [c["function"] for c in calls] == [
        {"name": "add", "arguments": '{"a": 1}'},
        {"name": "mul", "arguments": '{"b": 2}'},
    ]
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)
    assert len({c["id"] for c in calls}) == 2
    only, (call,) = parse_tool_calls('<tool_call>{"name": "f", "arguments": "{}"}</tool_call>')
    assert only is None and call["function"] == {"name": "f", "arguments": "{}"}
    assert parse_tool_calls("plain <tool_call>{}</tool_call>") == (
        "plain <tool_call>{}</tool_call>",
        [],
    )


def test_top_p_draw_keeps_the_nucleus() -> None:
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    # top_p=0.7 keeps {0, 1} (mass before token 2 is 0.8): renormalized cdf 0.625, 1.0
    assert [_draw(probs, 0.7, u) for u in (0.0, 0.6, 0.63, 0.99)] == [0, 0, 1, 1]
    assert [_draw(probs, 1.0, u) for u in (0.0, 0.49, 0.51, 0.81, 0.96)] == [0, 0, 1, 2, 3]
    assert _draw(probs, 0.3, 0.99) == 0  # the most likely token always stays
    # a nucleus wider than the top-k probe falls back to a full sort
    flat = torch.full((1000,), 1e-3)
    flat[7] = 0.0
    drawn = {_draw(flat, 0.9, u / 100) for u in range(100)}
    assert 7 not in drawn and len(drawn) > 50
