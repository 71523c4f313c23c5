"""The torch update recomputes exactly the logprobs the backend recorded, and moves them;
``weight_swap`` pauses the server around it and serves the trainer's new version."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch

from boltrl.gateway.backend import GenerationRequest
from boltrl.records import Transition
from boltrl_trainer.algorithms import make_config
from boltrl_trainer.config import LoraConfig, OptimConfig
from boltrl_trainer.models import load_model, tiny_model
from boltrl_trainer.policy import apply_lora
from boltrl_trainer.seams import PolicyServer, TrainBatch, TrainingBackend, weight_swap
from boltrl_trainer.serving import TransformersBackend
from boltrl_trainer.update import TorchTrainingBackend


@pytest.fixture(scope="module")
def policy() -> Any:
    torch.manual_seed(0)
    model, tok = load_model(str(tiny_model()))
    model = apply_lora(model, LoraConfig(r=4, alpha=8))
    model.train(False)
    return model, tok


def _sample(backend: TransformersBackend, prompts: list[str], temperature: float) -> list[Any]:
    futs = [
        backend.submit(
            GenerationRequest(
                messages=[{"role": "user", "content": p}], temperature=temperature, max_tokens=6
            )
        )
        for p in prompts
    ]
    return [f.result(60) for f in futs]


def _transitions(gens: list[Any]) -> list[Transition]:
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
            policy_version=0,
            call_ids=[f"c{i}"],
        )
        for i, g in enumerate(gens)
    ]


def _sampled_transitions(
    model: Any, tok: Any, prompts: list[str], seed: int, temperature: float = 1.0
) -> list[Transition]:
    """Sample ``prompts`` from ``model`` through a real ``TransformersBackend``; the
    replies as transitions (alternating rewards 0 / 1)."""
    backend = TransformersBackend(model, tok, max_batch=4, seed=seed)
    try:
        return _transitions(_sample(backend, prompts, temperature))
    finally:
        backend.close()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_recomputed_logprobs_match_the_recorded_ones(policy: Any, temperature: float) -> None:
    model, tok = policy
    trans = _sampled_transitions(
        model,
        tok,
        ["hi", "a longer prompt than that", "x", "two words"],
        seed=1,
        temperature=temperature,
    )
    tb = TorchTrainingBackend(model, make_config("grpo"), OptimConfig(), pad_id=tok.pad_token_id)
    x = tb._tensors(trans, [0.0] * len(trans))
    with torch.no_grad():
        new = tb._logprobs(x, temperature)
    assert torch.allclose(new * x["mask"], x["old"], atol=1e-4), (
        (new * x["mask"] - x["old"]).abs().max()
    )


def test_update_moves_the_policy_towards_advantaged_actions(policy: Any) -> None:
    model, tok = policy
    trans = _sampled_transitions(model, tok, ["hi", "hello", "hey", "yo"], seed=2)
    adv = [1.0, -1.0, 1.0, -1.0]
    tb = TorchTrainingBackend(
        model, make_config("grpo"), OptimConfig(lr=0.05), pad_id=tok.pad_token_id
    )
    x = tb._tensors(trans, adv)
    with torch.no_grad():
        before = (tb._logprobs(x, 1.0) * x["mask"]).sum(1)
    metrics = tb.update(TrainBatch(trans, adv, 0, 1.0))
    version = tb.policy_version
    with torch.no_grad():
        after = (tb._logprobs(x, 1.0) * x["mask"]).sum(1)
    assert version == 1
    assert metrics["update/logprob_mismatch"] < 1e-3  # first pass: same weights as sampling
    delta = after - before
    assert all(delta[i] > 0 for i in (0, 2)) and all(delta[i] < 0 for i in (1, 3)), delta


def test_weight_swap_pauses_generation_and_serves_the_trainers_version() -> None:
    torch.manual_seed(0)
    model, tok = load_model(str(tiny_model()))
    model = apply_lora(model, LoraConfig(r=4, alpha=8))
    model.train(False)
    server = TransformersBackend(model, tok, max_batch=4, seed=3)
    trainer = TorchTrainingBackend(model, make_config("grpo"), OptimConfig(), pad_id=0)
    assert isinstance(server, PolicyServer) and isinstance(trainer, TrainingBackend)
    try:
        trans = _transitions(_sample(server, ["hi", "hello"], 1.0))
        with server.paused():
            fut = _sample_later(server)
            time.sleep(0.2)
            assert not fut.done()  # no batch starts while paused
        assert fut.result(30).policy_version == 0
        with weight_swap(server, trainer):
            trainer.update(TrainBatch(trans, [1.0, -1.0], 0, 1.0))
            assert server.policy_version == 0  # served only once the swap is done
        assert trainer.policy_version == server.policy_version == 1
        assert _sample(server, ["hi"], 1.0)[0].policy_version == 1
        with pytest.raises(RuntimeError), weight_swap(server, trainer):
            raise RuntimeError("a failed update keeps the version")
        assert server.policy_version == 1
        with weight_swap(server, trainer):  # nothing to learn from: weights and version stay
            assert trainer.update(TrainBatch([], [], 1, 1.0))["update/skipped"] == 1.0
        assert trainer.policy_version == server.policy_version == 1
        server.set_policy_version(0)
        assert server.policy_version == 0
    finally:
        server.close()


def _sample_later(backend: TransformersBackend) -> Any:
    request = GenerationRequest(
        messages=[{"role": "user", "content": "Hi"}], temperature=0, max_tokens=2
    )
    return backend.submit(request)


@pytest.mark.parametrize("lora", [True, False])
def test_kl_reference_is_the_policy_rl_started_from(tmp_path: Any, lora: bool) -> None:
    """The KL penalty anchors to the weights of the first update (after a warm start,
    the warm-started policy; not the base model under the adapters), with LoRA and with a
    full fine-tune, and a checkpoint keeps that anchor for a resumed run."""
    torch.manual_seed(0)
    model, tok = load_model(str(tiny_model()))
    if lora:
        model = apply_lora(model, LoraConfig(r=4, alpha=8))
    model.train(False)
    trans = _sampled_transitions(
        model, tok, ["hi", "hi", "a longer prompt", "a longer prompt"], seed=2
    )
    algo = make_config("grpo", {"kl_coef": 0.5})

    def trainer(m: Any) -> TorchTrainingBackend:
        return TorchTrainingBackend(m, algo, OptimConfig(lr=1e-2), pad_id=tok.pad_token_id)

    tb = trainer(model)
    with torch.no_grad():  # "a warm start": trainable weights away from the base model's
        for p in tb.params:
            p.add_(0.01 * torch.randn_like(p))
    start = [p.detach().clone() for p in tb.params]
    batch = TrainBatch(trans, [1.0, -1.0, 1.0, -1.0], policy_version=0, temperature=1.0)
    first = tb.update(batch)
    assert first["update/kl_ref"] < 1e-9  # the policy is its own reference at the start
    assert tb._ref is not None
    assert all(torch.equal(r, s) for r, s in zip(tb._ref, start, strict=True))
    second = tb.update(batch)
    assert second["update/kl_ref"] > 1e-7  # the weights moved away from it

    tb.save(tmp_path / "ckpt")
    resumed = trainer(model)
    resumed.load(tmp_path / "ckpt", policy_version=2)
    assert resumed._ref is not None
    assert all(torch.equal(r, s) for r, s in zip(resumed._ref, start, strict=True))


def test_kl_reference_runs_once_a_microbatch_over_all_epochs(policy: Any) -> None:
    """Epochs after the first reuse the reference's logprobs of epoch 0 (neither its
    weights nor the batch change): one reference forward a micro-batch per update, not
    one an epoch."""
    model, tok = policy
    trans = _sampled_transitions(
        model, tok, ["hi", "hi", "a longer prompt", "a longer prompt"], seed=3
    )
    batch = TrainBatch(trans, [1.0, -1.0, 1.0, -1.0], policy_version=0, temperature=1.0)
    algo = make_config("grpo", {"kl_coef": 0.5})
    tb = TorchTrainingBackend(model, algo, OptimConfig(lr=1e-2, epochs=3), pad_id=tok.pad_token_id)
    tb._share_states = False  # the plain forward: one embedding call a forward
    forwards = 0

    def count(*_: Any) -> None:
        nonlocal forwards
        forwards += 1

    hook = model.get_input_embeddings().register_forward_hook(count)
    try:
        tb.update(batch)  # sets the reference: the weights before this update
        forwards = 0
        m = tb.update(batch)
    finally:
        hook.remove()
    micro = int(m["update/microbatches"])
    assert forwards == micro * (1 + 3)  # one reference pass, three epochs with grad
    assert m["update/kl_ref"] > 1e-7 and m["time/reference_s"] > 0.0
