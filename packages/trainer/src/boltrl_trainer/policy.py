"""The configured policy, in-process: load it (with LoRA when configured) and serve it.

``serve_policy`` is the one place a ``TransformersBackend`` is built from a config: the
torch backend trains the model it serves, and ``boltrl eval`` evaluates through it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from boltrl.errors import InvalidInput
from boltrl_trainer.config import LoraConfig, TrainConfig
from boltrl_trainer.models import load_model
from boltrl_trainer.serving import TransformersBackend

log = logging.getLogger(__name__)

__all__ = ["apply_lora", "load_policy", "pick_device", "serve_policy"]


def pick_device(name: str) -> str:
    """``auto`` → ``cuda`` when available, else ``cpu``; anything else as given."""
    if name != "auto":
        return name
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def apply_lora(model: Any, cfg: LoraConfig) -> Any:
    """Wrap ``model`` with peft LoRA adapters on the configured modules."""
    from peft import LoraConfig as PeftLora
    from peft import get_peft_model

    names = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
    missing = [m for m in cfg.target_modules if m not in names]
    if missing:
        raise InvalidInput(
            f"lora.target_modules: {missing} not found in the model (it has e.g. "
            f"{sorted(n for n in names if n.endswith('proj'))[:8]})"
        )
    peft_cfg = PeftLora(
        r=cfg.r,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=list(cfg.target_modules),
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, peft_cfg)


def load_policy(cfg: TrainConfig, *, lora: bool = True) -> tuple[Any, Any]:
    """The model (with LoRA when configured and ``lora``) and its tokenizer, in
    inference mode."""
    import torch

    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    model, tok = load_model(cfg.model, device=pick_device(cfg.device), dtype=dtype[cfg.dtype])
    if lora and cfg.lora is not None:
        model = apply_lora(model, cfg.lora)
    model.train(False)  # inference mode until an update
    return model, tok


def serve_policy(cfg: TrainConfig, model: Any, tokenizer: Any) -> TransformersBackend:
    """``model`` served in-process with the config's batching, reply cap and seed."""
    return TransformersBackend(
        model,
        tokenizer,
        max_batch=max(cfg.concurrency, 1),
        batch_window_s=0.02,
        max_tokens=cfg.max_tokens,
        model_name="policy",
        seed=cfg.seed,
    )


def serve_for_eval(cfg: TrainConfig, checkpoint: Path | None) -> TransformersBackend:
    """The configured policy served for evaluation: the base model, or with LoRA and
    ``checkpoint``'s trainable weights (weights only: evaluation needs no optimizer)."""
    model, tok = load_policy(cfg, lora=checkpoint is not None)
    server = serve_policy(cfg, model, tok)
    if checkpoint is not None:
        try:
            server.load_weights(checkpoint)
        except BaseException:
            server.close()
            raise
    return server
