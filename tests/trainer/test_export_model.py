"""``boltrl export-model``: checkpoints of a real 1-step ``boltrl train`` on the tiny model,
exported through the real CLI and loaded by the libraries users serve with; their logits
match the trainer's own model (loaded from the checkpoint the boltrl way) to 1e-4."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from trainer_harness import VOWEL_AGENT, run_cli, run_cli_ok, write_project

from boltrl_trainer.config import LoraConfig
from boltrl_trainer.export_model import export_model, load_checkpoint_policy
from boltrl_trainer.models import SMOLLM2_CHAT_TEMPLATE

MESSAGES = [{"role": "user", "content": "What is 12 + 30?"}]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, tiny_model_path: Path) -> dict[str, Path]:
    """One-step training runs of the tiny model: ``lora`` and ``full`` (a full fine-tune)."""
    d = tmp_path_factory.mktemp("export")
    cfg = {
        "agent": "agent.py:agent",
        "model": str(tiny_model_path),
        "steps": 1,
        "batch_tasks": 2,
        "group_size": 4,
        "concurrency": 8,
        "max_tokens": 8,
        "lora": {"r": 4, "alpha": 8},
        "optim": {"lr": 0.05},
        "val_every": 0,
        "progress": False,
    }
    tasks = {"train": [{"id": f"t{i}", "prompt": f"Say a word about {i}."} for i in range(2)]}
    write_project(d, cfg, files={"agent.py": VOWEL_AGENT}, tasks=tasks)
    out = {}
    for name, extra in (("lora", []), ("full", ["--set", "lora=null", "--set", "optim.lr=0.01"])):
        run_cli_ok("train", "train.yaml", "--out", str(d / name), *extra, cwd=d, threads=2)
        out[name] = d / name
    return out


def _logits(model: Any, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


def _prompt(tokenizer: Any) -> torch.Tensor:
    ids = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    return torch.tensor([list(ids)])


def _trained(run: Path) -> tuple[Any, torch.Tensor]:
    """The trainer's own model from the run's checkpoint (as boltrl loads it) and a prompt."""
    policy, tokenizer, _ = load_checkpoint_policy(run / "checkpoints" / "step-000001")
    return policy, _prompt(tokenizer)


def test_peft_export_loads_with_peft_and_matches(runs: dict[str, Path], tmp_path: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    policy, ids = _trained(runs["lora"])
    want = _logits(policy, ids)
    base_model_path = policy.get_base_model().config._name_or_path
    with policy.disable_adapter():
        untrained = _logits(policy, ids)
    assert (want - untrained).abs().max() > 1e-3, "the step did not change the model"

    out = tmp_path / "adapter"
    proc = run_cli_ok(
        "export-model", str(runs["lora"]), "--format", "peft", "--out", str(out), cwd=tmp_path
    )
    assert "--lora-modules" in proc.stdout
    assert {"adapter_config.json", "adapter_model.safetensors", "boltrl_export.json"} <= {
        p.name for p in out.iterdir()
    }
    adapter_cfg = json.loads((out / "adapter_config.json").read_text())
    assert (adapter_cfg["r"], adapter_cfg["lora_alpha"], adapter_cfg["peft_type"]) == (4, 8, "LORA")
    assert adapter_cfg["base_model_name_or_path"] == base_model_path

    base = AutoModelForCausalLM.from_pretrained(base_model_path, dtype=torch.float32)
    loaded = PeftModel.from_pretrained(base, str(out)).eval()
    assert (_logits(loaded, ids) - want).abs().max() < 1e-4

    provenance = json.loads((out / "boltrl_export.json").read_text())
    assert provenance["format"] == "peft" and provenance["step"] == 1
    assert provenance["policy_version"] == 1 and provenance["boltrl"]["boltrl-trainer"]


@pytest.mark.parametrize("run", ["lora", "full"])
def test_merged_export_loads_with_transformers_and_matches(
    runs: dict[str, Path], tmp_path: Path, run: str, tiny_model_path: Path
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    policy, ids = _trained(runs[run])
    want = _logits(policy, ids)
    out = export_model(runs[run] / "checkpoints", tmp_path / "merged", format="merged")
    model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    assert type(model).__name__ == "LlamaForCausalLM"  # a plain model: no PEFT wrapper
    assert not any("lora" in n for n, _ in model.named_parameters())
    assert (_logits(model, ids) - want).abs().max() < 1e-4
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_path), dtype=torch.float32)
    assert (_logits(base, ids) - want).abs().max() > 1e-3, "the export is the untrained model"

    exported_tok = AutoTokenizer.from_pretrained(str(out))
    assert exported_tok.chat_template == SMOLLM2_CHAT_TEMPLATE
    assert _prompt(exported_tok).tolist() == ids.tolist()
    lora = json.loads((out / "boltrl_export.json").read_text())["lora"]
    assert lora == (None if run == "full" else LoraConfig(r=4, alpha=8).model_dump())


def test_bad_exports_are_refused_and_write_nothing(runs: dict[str, Path], tmp_path: Path) -> None:
    from boltrl.errors import InvalidInput

    with pytest.raises(InvalidInput, match=r"--format peft: .* full fine-tune .* --format merged"):
        export_model(runs["full"], tmp_path / "a", format="peft")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "keep.txt").write_text("mine")
    with pytest.raises(InvalidInput, match=r"--out: .* not empty"):
        export_model(runs["lora"], tmp_path / "taken", format="merged")
    with pytest.raises(InvalidInput, match=r"no state.json"):
        export_model(tmp_path / "taken", tmp_path / "b", format="merged")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]
    proc = run_cli(
        "export-model", str(runs["lora"]), "--format", "onnx", "--out", "x", cwd=tmp_path
    )
    assert proc.returncode == 2 and "invalid choice: 'onnx'" in proc.stderr
