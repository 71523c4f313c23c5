"""Helpers of the TransformersBackend tests: requests, the token-truth check, forced replies."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from boltrl.gateway.backend import Generation, GenerationRequest
from boltrl.records import JSON
from boltrl_trainer._chat import TOOLS_PROMPT
from boltrl_trainer.models import load_model
from boltrl_trainer.serving import TransformersBackend


def chat(text: str, **kw: Any) -> GenerationRequest:
    return GenerationRequest(messages=[{"role": "user", "content": text}], **kw)


def recomputed_logprobs(
    model: Any, prompt_ids: list[int], response_ids: list[int], temperature: float
) -> torch.Tensor:
    """log_softmax of (temperature-scaled) logits at the sampled ids, by one full forward pass
    over prompt + response without padding or cache."""
    ids = torch.tensor([prompt_ids + response_ids])  # [1, P + R]
    with torch.no_grad():
        logits = model(ids).logits[0].float()  # [P + R, V]
    p = len(prompt_ids)
    scaled = logits[p - 1 : -1] / (temperature if temperature > 0 else 1.0)  # [R, V]
    picked = torch.tensor(response_ids)[:, None]  # [R, 1]
    return torch.log_softmax(scaled, dim=-1).gather(1, picked)[:, 0]


def assert_token_truth(
    b: TransformersBackend,
    messages: list[JSON],
    temperature: float,
    prompt_ids: list[int] | None,
    response_ids: list[int] | None,
    logprobs: list[float] | None,
    *,
    tools: list[JSON] | None = None,
) -> None:
    """Prompt ids are the rendered prompt's; logprobs match a fresh forward pass (1e-4).

    With ``tools``, the prompt is expected in boltrl's fallback format: a system block
    listing one tool schema (as given) per line.
    """
    if tools:
        block = TOOLS_PROMPT.format(tools="\n".join(json.dumps(t) for t in tools))
        messages = [{"role": "system", "content": block}, *messages]
    rendered = b.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert prompt_ids is not None and response_ids is not None and logprobs is not None
    assert b.tokenizer.decode(prompt_ids) == rendered
    assert prompt_ids == b.tokenizer(rendered, add_special_tokens=False)["input_ids"]
    assert len(logprobs) == len(response_ids) > 0
    expected = recomputed_logprobs(b.model, prompt_ids, response_ids, temperature)
    got = torch.tensor(logprobs)
    assert torch.allclose(got, expected, atol=1e-4, rtol=0), (got - expected).abs().max()


def assert_generation_truth(
    b: TransformersBackend, req: GenerationRequest, gen: Generation
) -> None:
    assert_token_truth(
        b,
        req.messages,
        req.temperature or 0.0,
        gen.prompt_token_ids,
        gen.response_token_ids,
        gen.response_logprobs,
    )
    assert gen.prompt_token_ids is not None and gen.response_token_ids is not None
    assert gen.usage == {
        "prompt_tokens": len(gen.prompt_token_ids),
        "completion_tokens": len(gen.response_token_ids),
        "total_tokens": len(gen.prompt_token_ids) + len(gen.response_token_ids),
    }


class ForcedReplies:
    """Backends whose private tiny model is pushed (+100 logits) to reply with an id script.

    Generation calls the model once per reply token (one row at a time); a full forward
    pass over prompt + script (the recomputation of ``assert_token_truth``) gets the same
    push, so token truth holds for the pushed model too.
    """

    def __init__(self, model_path: Path) -> None:
        self.model_path = model_path
        self.backends: list[TransformersBackend] = []

    def __call__(self, script: list[int]) -> TransformersBackend:
        model, tokenizer = load_model(self.model_path)
        calls = {"n": 0}

        def push(_module: Any, _inputs: Any, logits: torch.Tensor) -> torch.Tensor:
            logits = logits.clone()  # [b, t, V]
            if logits.shape[1] == 1:  # generation: the n-th call predicts the n-th token
                logits[..., script[calls["n"] % len(script)]] += 100.0
                calls["n"] += 1
            else:  # full pass: position t - 1 - len(script) + k predicts script[k]
                first = logits.shape[1] - 1 - len(script)
                for k, token in enumerate(script):
                    logits[:, first + k, token] += 100.0
            return logits

        model.lm_head.register_forward_hook(push)
        # no prefix cache: a prompt computed before would skip its forward pass and put
        # the call count out of step with the script
        b = TransformersBackend(
            model, tokenizer, max_tokens=len(script) + 8, max_batch=1, cache_positions=0
        )
        self.backends.append(b)
        return b

    def close(self) -> None:
        for b in self.backends:
            b.close()


Forced = Callable[[list[int]], TransformersBackend]
