"""The TRL side of the ``trl`` workload: GRPOTrainer on the demo task, in TRL's own venv.

Run by ``benchmarks/run.py --peer --workloads trl`` with the interpreter of
``benchmarks/.trl-venv`` (``trl_workload.ensure_trl_venv``), never the project's; it
imports nothing of boltrl. Reads one JSON object (argv[1]): the model folder, the train
and held-out problems, the settings; prints one JSON line of results on stdout.

Settings mirror ``boltrl demo``: LoRA r/alpha on attention + MLP, ``batch_tasks``
prompts x ``group_size`` samples per optimizer step, temperature, max new tokens, lr,
no KL, fp32, no gradient checkpointing (TRL's bf16 and checkpointing defaults are GPU
choices; on CPU both cost time). Micro-batches of 16 completions with 4 accumulation
steps per 64 completions (faster and a third of the memory of one micro-batch of 64 on
this CPU, ../../shared/FINDINGS.md). Held-out reward: greedy, the same problems and
score as boltrl's validation, before and after training.
"""

from __future__ import annotations

import json
import re
import sys
import time
from typing import Any

PROMPT = "What is {a} + {b}? Reply with only the number."
_NUMBER = re.compile(r"-?\d+")


def score(reply: str, answer: int) -> float:
    """``boltrl_trainer.demo.score``, repeated here (this venv has no boltrl); a test
    checks the two agree."""
    text = reply.strip().rstrip(".").replace(",", "").strip()
    if _NUMBER.fullmatch(text) is not None and int(text) == answer:
        return 1.0
    found = _NUMBER.findall(reply.replace(",", ""))
    return 0.5 if found and int(found[-1]) == answer else 0.0


def _messages(p: dict[str, int]) -> list[dict[str, str]]:
    return [{"role": "user", "content": PROMPT.format(a=p["a"], b=p["b"])}]


def evaluate(model: Any, tok: Any, problems: list[dict[str, int]], max_tokens: int) -> float:
    """Mean greedy score over ``problems`` (batched, left-padded, one pass)."""
    import torch

    texts = [
        tok.apply_chat_template(_messages(p), tokenize=False, add_generation_prompt=True)
        for p in problems
    ]
    side = tok.padding_side
    tok.padding_side = "left"
    try:
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    finally:
        tok.padding_side = side
    model.eval()
    with torch.no_grad():
        out = model.generate(
            **enc, max_new_tokens=max_tokens, do_sample=False, pad_token_id=tok.pad_token_id
        )
    replies = tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    return sum(score(r, p["a"] + p["b"]) for r, p in zip(replies, problems, strict=True)) / len(
        problems
    )


def main() -> int:
    spec = json.loads(sys.argv[1])
    t_start = time.perf_counter()
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.manual_seed(spec["seed"])
    tok = AutoTokenizer.from_pretrained(spec["model"])
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32)
    val_before = evaluate(model, tok, spec["val"], spec["max_tokens"])

    data = Dataset.from_list(
        [{"prompt": _messages(p), "answer": p["a"] + p["b"]} for p in spec["train"]]
    )

    def reward(completions: list[Any], answer: list[int], **_: Any) -> list[float]:
        return [score(c[0]["content"], a) for c, a in zip(completions, answer, strict=True)]

    group, tasks = spec["group_size"], spec["batch_tasks"]
    micro = min(16, group * tasks)
    args = GRPOConfig(
        output_dir=spec["out_dir"],
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=group * tasks // micro,
        num_generations=group,
        max_completion_length=spec["max_tokens"],
        temperature=spec["temperature"],
        learning_rate=spec["lr"],
        beta=0.0,
        max_steps=spec["steps"],
        bf16=False,
        gradient_checkpointing=False,
        use_cpu=True,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        seed=spec["seed"],
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    gen: list[tuple[float, int]] = []
    steps: list[float] = []

    class Timed(GRPOTrainer):  # type: ignore[misc]
        def _generate_and_score_completions(self, inputs: Any) -> Any:
            t0 = time.perf_counter()
            out = super()._generate_and_score_completions(inputs)
            gen.append((time.perf_counter() - t0, int(out["completion_mask"].sum())))
            return out

    class StepClock(TrainerCallback):  # type: ignore[misc]
        def __init__(self) -> None:
            self.t = 0.0

        def on_step_begin(self, *a: Any, **k: Any) -> None:
            if not self.t:
                self.t = time.perf_counter()

        def on_step_end(self, *a: Any, **k: Any) -> None:
            now = time.perf_counter()
            steps.append(now - self.t)
            self.t = now

    lora = spec["lora"]
    trainer = Timed(
        model=model,
        reward_funcs=reward,
        args=args,
        train_dataset=data,
        processing_class=tok,
        peft_config=LoraConfig(
            r=lora["r"],
            lora_alpha=lora["alpha"],
            lora_dropout=0.0,
            target_modules=lora["target_modules"],
            task_type="CAUSAL_LM",
        ),
        callbacks=[StepClock()],
    )
    t_train = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - t_train
    val_after = evaluate(trainer.model, tok, spec["val"], spec["max_tokens"])
    print(
        json.dumps(
            {
                "val_before": val_before,
                "val_after": val_after,
                "step_s": steps,
                "generation_s": [g[0] for g in gen],
                "generated_tokens": [g[1] for g in gen],
                "train_s": train_s,
                "wall_s": time.perf_counter() - t_start,
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
