"""The ``verl:`` section of a ``boltrl train`` config (read with ``backend: verl``).

Only what boltrl's own settings cannot express lives here: the cluster shape, rollout
parallelism, micro-batching and memory switches. Model, LoRA, learning rate, epochs,
clipping, KL and sampling come from the usual top-level settings and are mapped onto
verl's config by ``boltrl_trainer.verl.config``. Kept free of heavy imports: the
trainer's config module imports it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class VerlConfig(BaseModel):
    """Settings of the verl backend (multi-GPU / multi-node on Ray)."""

    model_config = ConfigDict(extra="forbid")

    nnodes: int = Field(default=1, ge=1)
    """Machines in the Ray cluster that train (each contributes ``n_gpus_per_node``)."""
    n_gpus_per_node: int = Field(default=1, ge=1)
    """GPUs used on each machine; the actor (FSDP) and the vLLM rollout share them."""
    rollout_tp: int = Field(default=1, ge=1)
    """Tensor-parallel size of one vLLM replica. ``nnodes * n_gpus_per_node / rollout_tp``
    replicas serve the gateway's calls; 1 suits models up to ~8B on 80 GB GPUs."""
    gpu_memory_utilization: float = Field(default=0.5, gt=0.0, le=0.95)
    """Fraction of each GPU vLLM may take for weights and KV cache while rollouts run
    (it sleeps, freeing it, during the update)."""
    micro_batch_size_per_gpu: int | None = Field(default=None, ge=1)
    """Rows per forward/backward on one GPU. None (default): micro-batches are packed by
    tokens instead, up to ``optim.token_budget`` per GPU (verl's dynamic batch size)."""
    log_prob_micro_batch_size_per_gpu: int | None = Field(default=None, ge=1)
    """Rows per forward when recomputing old/reference logprobs; None: as the update
    (``micro_batch_size_per_gpu``, or packed by tokens). Only used when something
    computes logprobs (``old_logprobs: recompute`` or a KL penalty)."""
    max_model_len: int | None = Field(default=None, ge=16)
    """Longest prompt + response vLLM accepts; None: the model's maximum context."""
    strategy: Literal["fsdp", "fsdp2"] = "fsdp"
    """verl's training engine for the actor (and reference)."""
    param_offload: bool = False
    """Keep actor parameters on CPU between uses (saves GPU memory, costs time)."""
    optimizer_offload: bool = False
    """Keep optimizer state on CPU between updates."""
    gradient_checkpointing: bool = True
    """Recompute activations in the backward pass (less memory, ~30% more compute)."""
    enforce_eager: bool = False
    """Run vLLM without CUDA graphs (faster start, slower sampling)."""
    tool_call_parser: str | None = None
    """vLLM's parser of the model's tool calls (``hermes`` for Qwen2.5), for agents that
    pass OpenAI ``tools``; None: vLLM serves without tool calling and refuses requests
    that need it."""
    old_logprobs: Literal["recompute", "rollout"] = "recompute"
    """The PPO ratio's denominator. ``recompute``: the actor's logprobs of the batch
    before the update (verl's default; immune to vLLM/FSDP numeric differences, costs
    one forward pass). ``rollout``: the logprobs vLLM recorded at sampling time (what the
    torch backend uses)."""
    advantages: Literal["boltrl", "verl"] = "boltrl"
    """``boltrl``: boltrl's credit assignment and ``algorithm`` compute the advantages
    and verl only applies the update. ``verl``: each transition's credited reward is
    placed on its last response token and verl's estimator (``grpo`` / ``rloo``) computes
    advantages grouped by task."""
    ray_address: str | None = None
    """Ray cluster to join (``auto`` for the one started with ``ray start``); None starts
    a local one. Multi-node runs need a cluster (see docs/gpu.md)."""
    overrides: dict[str, Any] = Field(default_factory=dict)
    """Raw verl settings by dotted key (``actor_rollout_ref.rollout.max_num_seqs: 512``),
    applied last. A key that a boltrl setting already maps is refused: set it there."""
