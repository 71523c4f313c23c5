"""boltrl's YAML → verl's config (verl 0.9.x ``ppo_trainer.yaml``), and its validation.

``verl_settings(cfg)`` lists every verl key boltrl sets, with its value and the boltrl
setting it comes from; ``verl_overrides(cfg)`` is that as a ``{dotted key: value}`` dict
with ``verl.overrides`` applied last. The backend composes verl's own
``ppo_trainer.yaml`` and applies these in struct mode, so a key verl does not know is an
error, never a silent no-op.

``check(cfg)`` lists the settings that would do nothing (or something other than what
they say) under ``backend: verl``; the verl entry of the backend registry
(``boltrl_trainer.verl.entry``) and the backend refuse a config with any, each error
naming its field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from boltrl.errors import InvalidInput
from boltrl_trainer.algorithms import GRPOConfig, ReinforceConfig, make_config
from boltrl_trainer.config import TrainConfig
from boltrl_trainer.verl.settings import VerlConfig

__all__ = [
    "Setting",
    "check",
    "data_parallel_size",
    "nominal_batch_size",
    "raise_if_invalid",
    "row_multiple",
    "verl_overrides",
    "verl_settings",
]

_ESTIMATORS = {"grpo": "grpo", "rloo": "rloo"}
_DTYPES = {"bfloat16": "bfloat16", "float16": "float16"}


@dataclass(frozen=True)
class Setting:
    """One verl key boltrl sets."""

    key: str
    """Dotted path in verl's config."""
    value: Any
    source: str
    """The boltrl setting it comes from (``optim.lr``), or ``(boltrl)`` for fixed ones."""


def _verl(cfg: TrainConfig) -> VerlConfig:
    return cfg.verl if cfg.verl is not None else VerlConfig()


def data_parallel_size(cfg: TrainConfig) -> int:
    """Data-parallel ranks of the actor: every GPU (FSDP, no sequence parallelism)."""
    v = _verl(cfg)
    return v.nnodes * v.n_gpus_per_node


def row_multiple(cfg: TrainConfig) -> int:
    """A batch's row count must be a multiple of this: every data-parallel rank gets the
    same rows, which split into whole micro-batches (of the update and, when logprobs are
    recomputed, of that forward) when these are counted in rows."""
    v = _verl(cfg)
    rows = math.lcm(v.micro_batch_size_per_gpu or 1, _log_prob_micro(v) or 1)
    return data_parallel_size(cfg) * rows


def _log_prob_micro(v: VerlConfig) -> int | None:
    """Rows per logprob forward: its own setting, else the update's (None: by tokens)."""
    return v.log_prob_micro_batch_size_per_gpu or v.micro_batch_size_per_gpu


def nominal_batch_size(cfg: TrainConfig) -> int:
    """Rollouts per step, rounded up to ``row_multiple``: what verl validates its
    mini-batch settings against (each update then uses its real, padded, size)."""
    m = row_multiple(cfg)
    return -(-cfg.batch_tasks * cfg.group_size // m) * m


def check(cfg: TrainConfig) -> list[str]:
    """Problems with ``cfg`` for the verl backend, each ``field: what and how to fix``."""
    if cfg.backend != "verl":
        if cfg.verl is not None:
            return [
                f"verl: set, but backend is {cfg.backend!r}, so it would be ignored; "
                "set backend: verl or remove the section"
            ]
        return []
    v = _verl(cfg)
    problems: list[str] = []
    if cfg.model == "smollm2" or cfg.model.endswith(".gguf"):
        problems.append(
            f"model: {cfg.model!r} is the CPU default (a GGUF file), which vLLM and FSDP do "
            "not load; name a Hugging Face model (a local directory or a hub id such as "
            "Qwen/Qwen2.5-Coder-1.5B-Instruct)"
        )
    if cfg.device != "auto":
        problems.append(
            f"device: {cfg.device!r} does nothing with backend verl, which places work on "
            "verl.nnodes x verl.n_gpus_per_node GPUs; remove it"
        )
    if cfg.dtype not in _DTYPES:
        problems.append(
            f"dtype: {cfg.dtype!r} is not supported by backend verl (its FSDP actor runs "
            "flash-attention, which needs half precision); set dtype: bfloat16"
        )
    world = data_parallel_size(cfg)
    if world % v.rollout_tp:
        problems.append(
            f"verl.rollout_tp: {v.rollout_tp} must divide the GPU count "
            f"(verl.nnodes x verl.n_gpus_per_node = {world})"
        )
    elif v.rollout_tp > v.n_gpus_per_node and v.rollout_tp % v.n_gpus_per_node:
        problems.append(
            f"verl.rollout_tp: {v.rollout_tp} spans nodes, so it must be a multiple of "
            f"verl.n_gpus_per_node ({v.n_gpus_per_node})"
        )
    if v.micro_batch_size_per_gpu is not None and "token_budget" in cfg.optim.model_fields_set:
        problems.append(
            "optim.token_budget: does nothing when verl.micro_batch_size_per_gpu is set "
            "(micro-batches are then counted in rows); remove one of the two"
        )
    if cfg.lora is not None and cfg.lora.dropout != 0.0:
        problems.append(
            f"lora.dropout: {cfg.lora.dropout} is not applied by verl's FSDP LoRA; set it to 0"
        )
    algo = make_config(cfg.algorithm, cfg.algo)
    computes_logprobs = v.old_logprobs == "recompute" or algo.kl_coef > 0
    if v.log_prob_micro_batch_size_per_gpu is not None and not computes_logprobs:
        problems.append(
            "verl.log_prob_micro_batch_size_per_gpu: does nothing, since nothing recomputes "
            "logprobs (verl.old_logprobs is 'rollout' and the KL penalty is off); remove it"
        )
    if v.advantages == "verl":
        if isinstance(algo, ReinforceConfig):
            problems.append(
                "verl.advantages: 'verl' has no estimator for algorithm reinforce (its "
                "batch/running baseline); use advantages: boltrl, or algorithm grpo or rloo"
            )
        if isinstance(algo, GRPOConfig) and algo.std_eps != GRPOConfig.std_eps:
            problems.append(
                "grpo.std_eps: verl's GRPO estimator uses its own epsilon, so it would do "
                "nothing with verl.advantages: 'verl'; remove it or use advantages: boltrl"
            )
    mapped = {s.key: s.source for s in verl_settings(cfg)}
    for key in v.overrides:
        if key in mapped:
            problems.append(
                f"verl.overrides: {key!r} is set by {mapped[key]}; set it there instead"
            )
    return problems


def raise_if_invalid(cfg: TrainConfig) -> None:
    """``InvalidInput`` listing every problem ``check`` finds, under the config's source."""
    problems = check(cfg)
    if problems:
        lines = [f"invalid config {cfg.source}:"] + [f"  {p}" for p in problems]
        raise InvalidInput("\n".join(lines))


def verl_settings(cfg: TrainConfig) -> list[Setting]:
    """Every verl key boltrl sets for ``cfg``, with where its value comes from."""
    v = _verl(cfg)
    algo = make_config(cfg.algorithm, cfg.algo)
    arr, actor, rollout, ref = (
        "actor_rollout_ref",
        "actor_rollout_ref.actor",
        "actor_rollout_ref.rollout",
        "actor_rollout_ref.ref",
    )
    dynamic = v.micro_batch_size_per_gpu is None
    log_prob_micro = _log_prob_micro(v)
    dtype = _DTYPES.get(cfg.dtype, "bfloat16")
    fixed = "(boltrl)"
    out = [
        Setting(f"{arr}.model.path", cfg.model, "model"),
        Setting(
            f"{arr}.model.enable_gradient_checkpointing",
            v.gradient_checkpointing,
            "verl.gradient_checkpointing",
        ),
        Setting(f"{actor}.strategy", v.strategy, "verl.strategy"),
        Setting(f"{actor}.optim.lr", cfg.optim.lr, "optim.lr"),
        Setting(f"{actor}.optim.weight_decay", cfg.optim.weight_decay, "optim.weight_decay"),
        Setting(f"{actor}.optim.betas", list(cfg.optim.betas), "optim.betas"),
        Setting(f"{actor}.optim.clip_grad", cfg.optim.grad_clip, "optim.grad_clip"),
        Setting(f"{actor}.grad_clip", cfg.optim.grad_clip, "optim.grad_clip"),
        Setting(f"{actor}.ppo_epochs", cfg.optim.epochs, "optim.epochs"),
        Setting(f"{actor}.ppo_mini_batch_size", nominal_batch_size(cfg), "batch_tasks"),
        Setting(f"{actor}.use_dynamic_bsz", dynamic, "verl.micro_batch_size_per_gpu"),
        Setting(
            f"{actor}.ppo_micro_batch_size_per_gpu",
            v.micro_batch_size_per_gpu,
            "verl.micro_batch_size_per_gpu",
        ),
        Setting(f"{actor}.ppo_max_token_len_per_gpu", cfg.optim.token_budget, "optim.token_budget"),
        Setting(f"{actor}.clip_ratio_low", algo.clip_eps_low, f"{algo.name}.clip_eps_low"),
        Setting(f"{actor}.clip_ratio_high", algo.clip_eps_high, f"{algo.name}.clip_eps_high"),
        # boltrl's rollout normalization is exact under token-mean (see verl.convert)
        Setting(f"{actor}.loss_agg_mode", "token-mean", f"{algo.name}.loss_normalization"),
        Setting(f"{actor}.use_kl_loss", algo.kl_coef > 0, f"{algo.name}.kl_coef"),
        Setting(f"{actor}.kl_loss_coef", algo.kl_coef, f"{algo.name}.kl_coef"),
        Setting(f"{actor}.kl_loss_type", "low_var_kl", fixed),  # k3, as the torch backend
        Setting(f"{actor}.entropy_coeff", 0.0, fixed),
        Setting(f"{actor}.data_loader_seed", cfg.seed, "seed"),
        Setting(f"{actor}.fsdp_config.param_offload", v.param_offload, "verl.param_offload"),
        Setting(
            f"{actor}.fsdp_config.optimizer_offload", v.optimizer_offload, "verl.optimizer_offload"
        ),
        Setting(f"{actor}.fsdp_config.dtype", dtype, "dtype"),
        Setting(f"{actor}.fsdp_config.seed", cfg.seed, "seed"),
        Setting(f"{ref}.fsdp_config.dtype", dtype, "dtype"),
        Setting(f"{rollout}.name", "vllm", fixed),
        Setting(f"{rollout}.mode", "async", fixed),
        Setting(f"{rollout}.n", 1, "group_size"),  # groups are separate boltrl rollouts
        Setting(f"{rollout}.dtype", dtype, "dtype"),
        Setting(f"{rollout}.temperature", cfg.temperature, "temperature"),
        Setting(f"{rollout}.top_p", cfg.top_p, "top_p"),
        Setting(f"{rollout}.response_length", cfg.max_tokens, "max_tokens"),
        Setting(f"{rollout}.seed", cfg.seed, "seed"),
        Setting(f"{rollout}.tensor_model_parallel_size", v.rollout_tp, "verl.rollout_tp"),
        Setting(
            f"{rollout}.gpu_memory_utilization",
            v.gpu_memory_utilization,
            "verl.gpu_memory_utilization",
        ),
        Setting(f"{rollout}.max_model_len", v.max_model_len, "verl.max_model_len"),
        Setting(f"{rollout}.enforce_eager", v.enforce_eager, "verl.enforce_eager"),
        Setting(f"{rollout}.calculate_log_probs", True, fixed),
        Setting(f"{rollout}.agent.num_workers", 1, fixed),  # agents run in boltrl's runners
        Setting("data.train_batch_size", nominal_batch_size(cfg), "batch_tasks"),
        Setting("data.max_response_length", cfg.max_tokens, "max_tokens"),
        Setting("algorithm.adv_estimator", _ESTIMATORS.get(cfg.algorithm, "grpo"), "algorithm"),
        Setting(
            "algorithm.norm_adv_by_std_in_grpo",
            getattr(algo, "scale_by_std", True),
            "grpo.scale_by_std",
        ),
        Setting("algorithm.use_kl_in_reward", False, fixed),
        Setting("critic.enable", False, fixed),
        Setting("trainer.nnodes", v.nnodes, "verl.nnodes"),
        Setting("trainer.n_gpus_per_node", v.n_gpus_per_node, "verl.n_gpus_per_node"),
        Setting("trainer.total_training_steps", max(cfg.steps, 1), "steps"),
        Setting("trainer.project_name", "boltrl", fixed),
        Setting("trainer.experiment_name", Path(cfg.out_dir).name or "boltrl", "out_dir"),
        Setting("trainer.default_local_dir", str(Path(cfg.out_dir) / "verl"), "out_dir"),
        Setting("trainer.logger", ["console"], fixed),  # boltrl writes metrics itself
        Setting("trainer.val_before_train", False, fixed),
        Setting("trainer.test_freq", -1, fixed),
        Setting("trainer.save_freq", -1, fixed),
    ]
    for section in (ref, rollout):
        out += [
            Setting(
                f"{section}.log_prob_use_dynamic_bsz",
                log_prob_micro is None,
                "verl.log_prob_micro_batch_size_per_gpu",
            ),
            Setting(
                f"{section}.log_prob_micro_batch_size_per_gpu",
                log_prob_micro,
                "verl.log_prob_micro_batch_size_per_gpu",
            ),
            Setting(
                f"{section}.log_prob_max_token_len_per_gpu",
                cfg.optim.token_budget,
                "optim.token_budget",
            ),
        ]
    if v.tool_call_parser is not None:
        out.append(
            Setting(
                f"{rollout}.engine_kwargs.vllm",
                {"enable_auto_tool_choice": True, "tool_call_parser": v.tool_call_parser},
                "verl.tool_call_parser",
            )
        )
    lora = cfg.lora
    out += [
        Setting(f"{arr}.model.lora_rank", lora.r if lora else 0, "lora.r"),
        Setting(f"{arr}.model.lora_alpha", lora.alpha if lora else 16, "lora.alpha"),
        Setting(
            f"{arr}.model.target_modules",
            list(lora.target_modules) if lora else "all-linear",
            "lora.target_modules",
        ),
        # the rollout is served over HTTP by base-model name: merged weights are what it
        # serves (an unmerged adapter would need per-request LoRA selection)
        Setting(f"{arr}.model.lora.merge", lora is not None, "lora"),
    ]
    return out


def verl_overrides(cfg: TrainConfig) -> dict[str, Any]:
    """``{dotted verl key: value}`` for ``cfg``: the mapped settings, then ``verl.overrides``.

    Raises ``InvalidInput`` (naming fields) when ``check`` finds problems.
    """
    raise_if_invalid(cfg)
    out = {s.key: s.value for s in verl_settings(cfg)}
    out.update(_verl(cfg).overrides)
    return out
