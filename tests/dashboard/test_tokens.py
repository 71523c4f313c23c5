"""Decoding response tokens for the token view: scripted bytes, a real tokenizer, ids."""

from __future__ import annotations

import os

import pytest

from boltrl.dashboard.tokens import TokenDecoder, token_view
from boltrl.records import LLMCall
from boltrl.testing import TEMPLATE_HASH


def _call(ids: list[int], template: str) -> LLMCall:
    return LLMCall(
        id="c", rollout_id="r", attempt=1, prompt_token_ids=[1, 2],
        response_token_ids=ids, response_logprobs=[-0.5] * len(ids), template_hash=template,
    )  # fmt: skip


def test_scripted_ids_are_utf8_bytes() -> None:
    view = token_view(_call(list("ok é".encode()), TEMPLATE_HASH), TokenDecoder())
    assert view["pieces"] == ["o", "k", " ", "\\xc3", "\\xa9"]
    assert view["decoded_by"] == "scripted-bytes" and view["prompt_tokens"] == 2


def test_a_tokenizer_decodes_each_id_and_a_missing_one_leaves_ids(
    caplog: pytest.LogCaptureFixture,
) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    from boltrl_trainer.models import tiny_model

    path = str(tiny_model())
    ids = AutoTokenizer.from_pretrained(path).encode("Hello world, it's 4.")
    view = token_view(_call(ids, "real"), TokenDecoder(path))
    assert "".join(view["pieces"]) == "Hello world, it's 4."
    assert len(view["pieces"]) == len(ids) and view["decoded_by"] == f"tokenizer {path}"
    missing = TokenDecoder("/nonexistent/tokenizer")
    assert missing.pieces(_call(ids, "real")) == (None, "none")
    assert "cannot load tokenizer" in caplog.text
