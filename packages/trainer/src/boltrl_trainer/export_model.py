"""``boltrl export-model``: a training checkpoint in the formats other tools serve.

A boltrl checkpoint (``trainable.safetensors`` + ``optimizer.pt`` + ``state.json``) holds
only the trained weights and needs boltrl to load. Two exports:

- ``peft``: a PEFT adapter folder (``adapter_config.json`` + ``adapter_model.safetensors``)
  for ``PeftModel.from_pretrained(base, DIR)`` or vLLM's ``--lora-modules name=DIR``.
  LoRA checkpoints only.
- ``merged``: a whole Hugging Face model folder (weights, config, tokenizer with its chat
  template) for ``AutoModelForCausalLM.from_pretrained(DIR)``, vLLM or TGI. LoRA
  checkpoints are merged into the base weights; full fine-tunes are saved as they are.

The weights are loaded exactly as ``boltrl eval --checkpoint`` loads them (the config in the
checkpoint's ``state.json`` names the base model and LoRA settings), so an export computes
the same logits as the trainer's own model. Each export also holds ``boltrl_export.json``:
where it came from (checkpoint, step, policy version, base model, boltrl versions).
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any, Literal

from boltrl.errors import InvalidInput

log = logging.getLogger(__name__)

ExportFormat = Literal["peft", "merged"]
FORMATS: tuple[ExportFormat, ...] = ("peft", "merged")


def find_checkpoint(path: str | Path) -> Path:
    """The checkpoint folder ``path`` names: a checkpoint itself, a run's ``checkpoints``
    folder or a run's ``out_dir`` (both meaning their latest checkpoint)."""
    p = Path(path).expanduser()
    for folder in (p, p / "checkpoints"):
        latest = folder / "latest"
        if latest.is_file():
            return folder / latest.read_text().strip()
    if not p.is_dir():
        raise InvalidInput(f"checkpoint {p}: no such folder")
    return p


def checkpoint_config(checkpoint: Path) -> Any:
    """The ``TrainConfig`` a checkpoint was trained with (from its ``state.json``)."""
    from boltrl_trainer.config import TrainConfig

    state_path = checkpoint / "state.json"
    if not state_path.is_file():
        raise InvalidInput(f"checkpoint {checkpoint}: no state.json (not a boltrl checkpoint)")
    state = json.loads(state_path.read_text())
    if not isinstance(state.get("config"), dict):
        raise InvalidInput(f"checkpoint {checkpoint}: state.json holds no training config")
    cfg = TrainConfig.model_validate(state["config"])
    if cfg.backend == "verl" or (checkpoint / "actor").is_dir():
        raise InvalidInput(
            f"checkpoint {checkpoint}: a verl checkpoint (sharded actor state); convert it "
            f"with verl's model merger: python -m verl.model_merger merge --backend fsdp "
            f"--local_dir {checkpoint / 'actor'} --target_dir OUT"
        )
    if not (checkpoint / "trainable.safetensors").is_file():
        raise InvalidInput(f"checkpoint {checkpoint}: trainable.safetensors missing")
    return cfg


def load_checkpoint_policy(checkpoint: Path, *, device: str = "cpu") -> tuple[Any, Any, Any]:
    """``(policy, tokenizer, config)``: the trainer's model with the checkpoint's weights,
    loaded the way ``boltrl eval --checkpoint`` loads it (a ``PeftModel`` when LoRA)."""
    from boltrl_trainer.policy import load_policy
    from boltrl_trainer.update import load_trainable

    cfg = checkpoint_config(checkpoint).model_copy(update={"device": device})
    policy, tokenizer = load_policy(cfg)
    load_trainable(policy, checkpoint)
    policy.eval()
    return policy, tokenizer, cfg


def _drop_quantization(model: Any) -> None:
    # A model read from GGUF carries the GGUF loading recipe; save_pretrained refuses it
    # ("not serializable") although the weights are plain float tensors by now.
    for holder in (model.config, model):
        if hasattr(holder, "quantization_config"):
            delattr(holder, "quantization_config")
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
        model.is_quantized = False


def export_model(
    checkpoint: str | Path, out: str | Path, *, format: ExportFormat = "merged"
) -> Path:
    """Write ``checkpoint`` (see ``find_checkpoint``) as a ``format`` export into ``out``.

    ``out`` must not exist or be empty; the export is written into a temporary folder beside
    it and renamed into place, so a failure leaves nothing half-written. Blocks while
    loading and saving (seconds for small models). Raises ``InvalidInput`` for a checkpoint
    that cannot be exported in ``format``. Returns ``out``.
    """
    from boltrl import cli
    from boltrl_trainer import models

    if format not in FORMATS:
        raise InvalidInput(f"--format: {format!r} is not one of {', '.join(FORMATS)}")
    ckpt = find_checkpoint(checkpoint)
    cfg = checkpoint_config(ckpt)
    if format == "peft" and cfg.lora is None:
        raise InvalidInput(
            f"--format peft: checkpoint {ckpt} is a full fine-tune (lora: null), which has "
            "no adapter; export it with --format merged"
        )
    final = Path(out).expanduser()
    if final.exists() and (not final.is_dir() or any(final.iterdir())):
        raise InvalidInput(f"--out: {final} exists and is not empty")
    policy, tokenizer, cfg = load_checkpoint_policy(ckpt)
    base = models.resolve_model(cfg.model)
    state = json.loads((ckpt / "state.json").read_text())
    provenance = {
        "format": format,
        "checkpoint": str(ckpt.resolve()),
        "step": state.get("step"),
        "policy_version": state.get("policy_version"),
        "model": cfg.model,
        "base_model_path": base,
        "lora": None if cfg.lora is None else cfg.lora.model_dump(mode="json"),
        "boltrl": dict(cli.installed_versions()),
    }

    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        if format == "peft":
            policy.save_pretrained(tmp, safe_serialization=True)
        else:
            model = policy.merge_and_unload() if cfg.lora is not None else policy
            _drop_quantization(model)
            model.save_pretrained(tmp, safe_serialization=True)
            models.ensure_chat_template(tokenizer)
            tokenizer.save_pretrained(tmp)
        (tmp / "boltrl_export.json").write_text(json.dumps(provenance, indent=2))
        if final.exists():
            final.rmdir()  # checked empty above
        tmp.rename(final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("exported %s as %s into %s", ckpt, format, final)
    return final
