"""The torch backend's separate training copy: train a candidate while the server keeps
generating from the served weights, then promote it (``seams.promote_swap``) or reset it."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch

from boltrl.gateway.backend import GenerationRequest
from boltrl.records import Transition
from boltrl_trainer.algorithms import make_config
from boltrl_trainer.config import LoraConfig, OptimConfig
from boltrl_trainer.models import load_model, tiny_model
from boltrl_trainer.policy import apply_lora
from boltrl_trainer.seams import CandidateTrainer, TrainBatch, promote_swap
from boltrl_trainer.serving import TransformersBackend
from boltrl_trainer.update import TorchTrainingBackend


def _served(lora: bool) -> tuple[TransformersBackend, TorchTrainingBackend]:
    torch.manual_seed(0)
    model, tok = load_model(str(tiny_model()))
    if lora:
        model = apply_lora(model, LoraConfig(r=4, alpha=8))
    model.train(False)
    server = TransformersBackend(model, tok, max_batch=4, seed=1)
    trainer = TorchTrainingBackend(model, make_config("grpo"), OptimConfig(lr=0.05), pad_id=0)
    return server, trainer


def _ask(server: TransformersBackend, prompt: str = "hi") -> Any:
    request = GenerationRequest(
        messages=[{"role": "user", "content": prompt}], temperature=1.0, max_tokens=4
    )
    return server.submit(request).result(60)


def _transitions(gens: list[Any], version: int) -> list[Transition]:
    return [
        Transition(
            rollout_id=f"r{i}",
            task_id="t",
            group="t",
            step=0,
            agent=None,
            state=g.prompt_token_ids,
            action=g.response_token_ids,
            action_logprobs=g.response_logprobs,
            action_mask=[1] * len(g.response_token_ids),
            reward=float(i % 2),
            done=True,
            policy_version=version,
            call_ids=[f"c{i}"],
        )
        for i, g in enumerate(gens)
    ]


def _trainable(model: Any) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("lora", [True, False])
def test_a_candidate_trains_apart_then_is_promoted_or_reset(lora: bool) -> None:
    server, trainer = _served(lora)
    try:
        served0 = _trainable(server.model)
        trainer.use_separate_copy(resettable=True)
        assert isinstance(trainer, CandidateTrainer) and trainer.separate
        # frozen weights are shared, trainable ones are the copy's own
        frozen = {n: p for n, p in server.model.named_parameters() if not p.requires_grad}
        for n, p in trainer.model.named_parameters():
            if n in frozen:
                assert p.data_ptr() == frozen[n].data_ptr()
            else:
                assert p.data_ptr() != dict(server.model.named_parameters())[n].data_ptr()
        assert (len(frozen) > 0) == lora
        batch = TrainBatch(_transitions([_ask(server), _ask(server, "yo")], 0), [1.0, -1.0], 0, 1)

        # the update runs while the server generates: no pause, served weights untouched
        done = threading.Event()
        replies: list[Any] = []

        def generate() -> None:
            while not done.is_set():
                replies.append(_ask(server))

        gen = threading.Thread(target=generate)
        gen.start()
        try:
            trainer.update(batch)
        finally:
            done.set()
            gen.join(60)
        assert replies and all(r.policy_version == 0 for r in replies)
        assert _same(_trainable(server.model), served0)
        assert trainer.policy_version == 1 and trainer.served_version == 0
        candidate1 = _trainable(trainer.model)
        assert not _same(candidate1, served0)

        # reset: back to the served weights and version (optimizer too, below)
        trainer.reset()
        assert _same(_trainable(trainer.model), served0) and trainer.policy_version == 0
        trainer.update(batch)  # same batch, same restored optimizer state: same candidate
        assert _same(_trainable(trainer.model), candidate1)

        # promote: the served model gets the candidate, the server its version
        assert promote_swap(server, trainer) == 1
        assert server.policy_version == trainer.served_version == 1
        assert _same(_trainable(server.model), candidate1)
        assert _ask(server).policy_version == 1
        trainer.update(batch)
        trainer.reset()  # back to the promoted candidate, not to version 0
        assert _same(_trainable(trainer.model), candidate1) and trainer.policy_version == 1
    finally:
        server.close()


def test_reset_needs_a_resettable_copy_and_shared_mode_promotes_in_place() -> None:
    server, trainer = _served(lora=True)
    try:
        assert not trainer.separate and trainer.promote() == 0  # shared: already served
        with pytest.raises(RuntimeError, match="resettable"):
            trainer.reset()
        trainer.use_separate_copy()
        with pytest.raises(RuntimeError, match="resettable"):
            trainer.reset()
    finally:
        server.close()


def test_the_copy_never_keeps_a_forward_patched_onto_the_served_layers() -> None:
    from boltrl_trainer._lora_merge import merged_lora
    from boltrl_trainer.update import training_copy

    server, _ = _served(lora=True)
    server.close()
    model = server.model
    with torch.no_grad(), merged_lora(model) as n:  # as while a sampling loop runs
        assert n > 0
        copy = training_copy(model)
    assert not any("forward" in m.__dict__ for m in copy.modules())
    # a training step on the copy moves the copy's adapters, not the served ones
    served = _trainable(model)
    ids = torch.tensor([[1, 2, 3, 4]])
    copy.train()
    copy(input_ids=ids).logits.sum().backward()
    assert all(p.grad is None for p in model.parameters() if p.requires_grad)
    assert any(p.grad is not None for p in copy.parameters() if p.requires_grad)
    assert _same(_trainable(model), served)
