"""Shared prefills and merged LoRA weights in the sampling loop keep token truth."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from backend_util import assert_generation_truth, chat

from boltrl_trainer._lora_merge import merged_lora
from boltrl_trainer.config import LoraConfig
from boltrl_trainer.models import load_model
from boltrl_trainer.policy import apply_lora
from boltrl_trainer.serving import TransformersBackend

pytestmark = pytest.mark.usefixtures("no_backend_errors")


@pytest.fixture(scope="module")
def backend(tiny_model_path: Path) -> Iterator[TransformersBackend]:
    b = TransformersBackend(str(tiny_model_path), max_tokens=24, batch_window_s=0.2, seed=0)
    yield b
    b.close()


def _prompt_len(b: TransformersBackend, text: str) -> int:
    rendered = b.tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )
    return len(b.tokenizer(rendered, add_special_tokens=False)["input_ids"])


def test_rows_with_one_prompt_share_its_prefill(backend: TransformersBackend) -> None:
    """A group's samples (same prompt) arriving together are prefilled once, sampled
    independently, and each keeps token truth beside rows with other prompts."""
    group = [chat("What is 12 + 30?", temperature=1.0, max_tokens=8) for _ in range(6)]
    others = [
        chat("Tell me a story " * 5, temperature=0.7, max_tokens=6),
        chat("Hi", temperature=0, max_tokens=5),
    ]
    reqs = group + others
    with backend.paused():  # no loop running: these start one together
        before = backend.stats()
    futures = [backend.submit(r) for r in reqs]
    gens = [f.result(60) for f in futures]
    after = backend.stats()
    assert after["batches"] - before["batches"] == 1  # one loop, so one shared prefill
    served = sum(len(g.prompt_token_ids or []) for g in gens)
    distinct = sum(_prompt_len(backend, t) for t in ("What is 12 + 30?", "Tell me a story " * 5))
    distinct += _prompt_len(backend, "Hi")
    assert after["prompt_tokens"] - before["prompt_tokens"] == served
    assert after["prefill_tokens"] - before["prefill_tokens"] == distinct
    for req, gen in zip(reqs, gens, strict=True):
        assert_generation_truth(backend, req, gen)
    # shared logits, independent draws: a near-uniform random model never repeats 6 times
    assert len({tuple(g.response_token_ids or []) for g in gens[:6]}) > 1


def test_a_later_row_reuses_a_prompt_of_the_running_loop(tiny_model_path: Path) -> None:
    """A request arriving mid-loop with a prompt the loop already computed costs no
    prefill, and decodes what it would alone."""
    b = TransformersBackend(str(tiny_model_path), max_tokens=120, batch_window_s=0)
    try:
        long = chat("Hi there", temperature=0, max_tokens=120)
        same = chat("Hi there", temperature=0, max_tokens=10)
        alone = b.generate_sync(same)
        with b.paused():  # its loop has ended: the next request starts a fresh one
            before = b.stats()
        first = b.submit(long)
        while b.stats()["steps"] - before["steps"] < 5:
            time.sleep(0.001)
        gen = b.submit(same).result(60)
        assert not first.done()  # it really joined the running loop
        long_gen = first.result(60)
        after = b.stats()
        assert after["batches"] - before["batches"] == 1
        prompt = alone.prompt_token_ids or []
        assert after["prefill_tokens"] - before["prefill_tokens"] == len(prompt)
        assert gen.response_token_ids == alone.response_token_ids
        assert (long_gen.response_token_ids or [])[:10] == alone.response_token_ids
        assert_generation_truth(b, same, gen)
        assert_generation_truth(b, long, long_gen)
    finally:
        b.close()


def _lora_model(path: Path) -> tuple[Any, Any]:
    model, tok = load_model(path)
    model = apply_lora(model, LoraConfig(r=4, alpha=8))
    torch.manual_seed(0)
    with torch.no_grad():  # peft starts B at zero; a trained adapter has it non-zero
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    model.train(False)
    return model, tok


def test_lora_model_samples_through_merged_weights(tiny_model_path: Path) -> None:
    """Merged sampling records what the unmerged model computes (within 1e-4), and leaves
    every parameter as it was: same tensors, values, requires_grad."""
    model, tok = _lora_model(tiny_model_path)
    before = {n: (p, p.detach().clone(), p.requires_grad) for n, p in model.named_parameters()}
    adapted = sum(1 for n, _ in model.named_modules() if n.endswith("_proj"))
    x = torch.randint(0, 1000, (2, 7))
    with torch.no_grad():
        plain = model(x).logits
        with merged_lora(model) as merged:
            inside = model(x).logits
            names = {n for n, _ in model.named_parameters()}
        after_block = model(x).logits
    assert merged == adapted > 0
    assert (inside - plain).abs().max() < 1e-4
    assert (inside - plain).abs().max() > 0  # the merged path really ran
    assert torch.equal(after_block, plain)
    assert names == set(before)
    b = TransformersBackend(model, tok, max_tokens=12, batch_window_s=0.2, seed=0)
    try:
        reqs = [chat("Add 3 and 4.", temperature=1.0) for _ in range(3)]
        reqs.append(chat("Name a colour, please.", temperature=0))
        futures = [b.submit(r) for r in reqs]
        for req, fut in zip(reqs, futures, strict=True):
            assert_generation_truth(b, req, fut.result(60))
    finally:
        b.close()
    for n, p in model.named_parameters():
        tensor, value, grad = before[n]
        assert p is tensor and p.requires_grad == grad and torch.equal(p, value), n


def test_merge_leaves_training_and_other_threads_on_the_adapters(tiny_model_path: Path) -> None:
    """Inside the block, a forward with grad on (a training step) or from another thread
    runs the adapters' own path: gradients reach LoRA, outputs are bitwise unmerged."""
    model, _ = _lora_model(tiny_model_path)
    x = torch.randint(0, 1000, (2, 7))
    with torch.no_grad():
        plain = model(x).logits
    seen: list[torch.Tensor] = []
    with merged_lora(model) as merged:
        assert merged > 0
        model(x).logits.float().pow(2).mean().backward()
        worker = threading.Thread(target=lambda: seen.append(_no_grad_logits(model, x)))
        worker.start()
        worker.join()
    grads = [p.grad for n, p in model.named_parameters() if "lora_" in n]
    assert grads and all(g is not None and g.abs().sum() > 0 for g in grads)
    assert torch.equal(seen[0], plain)


def _no_grad_logits(model: Any, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out: torch.Tensor = model(x).logits
        return out


def test_merge_skips_a_model_in_training_mode(tiny_model_path: Path) -> None:
    model, _ = _lora_model(tiny_model_path)
    model.train(True)
    with merged_lora(model) as merged:
        assert merged == 0
    base, _ = load_model(tiny_model_path)
    with merged_lora(base) as merged:
        assert merged == 0
