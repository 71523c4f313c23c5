"""Generation through merged LoRA weights, with the model's own tensors left untouched.

peft's LoRA Linear computes ``x·Wᵀ + s·(x·Aᵀ)·Bᵀ``: per adapted layer three more matmuls
and a few element-wise ops on every forward pass. For a small model on a CPU those extra
ops cost as much as a third of a decode step (benchmarks/README.md, Training). Sampling
does not need them: inside ``merged_lora(model)`` each eligible layer runs one matmul with
``W + s·B·A``, computed once at the block's start.

Why not peft's ``merge_adapter()``: it adds the delta into ``W`` in place and subtracts it
again on unmerge, so the frozen base weights drift by rounding every time, and while
merged, the trainable weights are not what a checkpoint or an update would read. Here
nothing of the model changes: the parameters (values, ``requires_grad``, registration)
stay as they are, each layer only gets an instance ``forward`` that is removed on exit.
The price is one extra copy of the adapted weights while the block runs.

Only the plain case is merged: peft LoRA ``Linear`` over a ``torch.nn.Linear``, adapters
enabled and not already merged, no DoRA or other variant, no LoRA bias, module in eval
mode. Any other layer keeps its own forward (correct, just not faster).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch


def _mergeable_adapters(layer: Any) -> list[str] | None:
    """The active adapters of ``layer`` when it may run merged, else None."""
    try:
        from peft.tuners.lora.layer import Linear as LoraLinear
    except ImportError:  # pragma: no cover - peft is a dependency of the trainer
        return None
    if type(layer) is not LoraLinear or layer.training:
        return None
    if layer.merged or layer.disable_adapters:
        return None
    if type(layer.get_base_layer()) is not torch.nn.Linear:
        return None
    adapters = [a for a in layer.active_adapters if a in layer.lora_A]
    for a in adapters:
        if getattr(layer, "lora_variant", {}).get(a) is not None:
            return None
        if getattr(layer, "use_dora", {}).get(a) or getattr(layer, "lora_bias", {}).get(a):
            return None
    return adapters


def _merged_forward(layer: Any, weight: torch.Tensor, bias: torch.Tensor | None) -> Any:
    own = type(layer).forward
    thread = threading.get_ident()

    def forward(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        # Only the thread that merged, without grad, takes the merged path: a training
        # step (grad on) or any other thread running the model meanwhile keeps the
        # adapters' own forward, so a shared model never trains through a frozen copy.
        if threading.get_ident() != thread or torch.is_grad_enabled():
            out: torch.Tensor = own(layer, x, *args, **kwargs)
            return out
        return torch.nn.functional.linear(x, weight, bias)

    return forward


def _plus_delta(layer: Any, adapter: str, weight: torch.Tensor) -> torch.Tensor:
    """``weight + s·B·A`` as a new tensor: one fused ``addmm`` in the common case (same
    dtype, [out, in] layout), else through peft's own ``get_delta_weight``."""
    a, b = layer.lora_A[adapter].weight, layer.lora_B[adapter].weight  # [r, in], [out, r]
    if not layer.fan_in_fan_out and a.dtype == b.dtype == weight.dtype:
        return torch.addmm(weight, b, a, alpha=float(layer.scaling[adapter]))
    delta: torch.Tensor = layer.get_delta_weight(adapter)
    return weight + delta.to(weight.dtype)


@contextmanager
def merged_lora(model: Any) -> Iterator[int]:
    """Run ``model``'s eligible LoRA layers merged inside the block; yields how many.

    The merged path serves forward passes of the calling thread with grad disabled;
    anything else (a training step, another thread) gets the layers' own forward. The
    caller must keep the weights from changing while the block runs (the backend holds
    its lock, which ``paused()`` waits for); a model without LoRA passes through.
    """
    patched: list[Any] = []
    try:
        with torch.no_grad():
            for module in model.modules():
                adapters = _mergeable_adapters(module)
                if not adapters:
                    continue
                base = module.get_base_layer()
                weight = base.weight.detach()
                for a in adapters:
                    weight = _plus_delta(module, a, weight)
                module.forward = _merged_forward(module, weight, base.bias)
                patched.append(module)
        yield len(patched)
    finally:
        for module in patched:
            del module.forward  # the class's forward again
