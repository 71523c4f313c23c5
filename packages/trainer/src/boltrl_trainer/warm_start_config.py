"""The ``warm_start:`` section of a ``boltrl train`` / ``boltrl sft`` config.

A warm start is supervised fine-tuning on demonstrations collected by running the
user's real agent through the gateway, before any RL. The defaults are CPU-sized and come
from a measured probe on calc_agent (SmolLM2-135M, LoRA r16: 200 demonstrations, lr 5e-4,
2 epochs took greedy val reward 0.150 -> 0.717 in about three minutes on two cores).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag


class _Cfg(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TeacherModelConfig(_Cfg):
    """An OpenAI-compatible teacher model (rejection-sampling distillation): it plays the
    student's part, and only rollouts whose reward reaches ``warm_start.min_reward`` are
    kept; its replies are re-rendered through the student's chat template."""

    base_url: str
    """The server's OpenAI base URL, e.g. ``http://127.0.0.1:8000/v1``."""
    model: str
    """The model name to ask the server for."""
    api_key: str | None = None
    """Sent as a bearer token when set."""
    timeout_s: float = Field(default=600.0, gt=0)
    """Per-request timeout."""


class TeacherStoreConfig(_Cfg):
    """The policy's own successes (expert iteration): finished training rollouts read from
    a store, kept when their reward reaches ``warm_start.min_reward``. Their calls already
    carry the student's token ids."""

    store: str
    """Store URL (``sqlite:///runs/x/store.db``, ``http://host:port``)."""
    limit: int = Field(default=10_000, ge=1)
    """Read at most this many succeeded rollouts."""


def _teacher_kind(value: Any) -> str:
    if isinstance(value, str):
        return "function"
    if isinstance(value, dict):
        return "store" if "store" in value else "model"
    return "store" if isinstance(value, TeacherStoreConfig) else "model"


Teacher = Annotated[
    Annotated[str, Tag("function")]
    | Annotated[TeacherModelConfig, Tag("model")]
    | Annotated[TeacherStoreConfig, Tag("store")],
    Discriminator(_teacher_kind),
]


class WarmStartConfig(_Cfg):
    """Warm start from demonstrations (``boltrl sft``; ``boltrl train`` runs it before RL)."""

    teacher: Teacher
    """Who plays the model's part: ``file.py:function`` (a teacher function
    ``teach(task, request) -> str | {"content", "tool_calls"}`` that answers from a
    training task's gold data), ``{base_url, model, api_key?}`` (a teacher model), or
    ``{store: URL}`` (the policy's own successful rollouts: expert iteration)."""
    tasks: str | None = None
    """Tasks to demonstrate (a .jsonl file or module:function); default ``tasks.train``.
    They must be training tasks: any that is also a val/test task is refused."""
    limit: int | None = Field(default=None, ge=1)
    """Use only the first N tasks."""
    repeats: int = Field(default=1, ge=1)
    """Rollouts per task (more than 1 makes sense with a sampling teacher model)."""
    min_reward: float | None = None
    """Keep a rollout's demonstrations only when its reward is at least this (rejection
    sampling); None keeps every rollout that succeeded."""
    temperature: float = Field(default=0.0, ge=0)
    """Sampling temperature a teacher model is asked for (a teacher function ignores it)."""
    epochs: int = Field(default=2, ge=1)
    """Passes over the demonstrations (2: the measured CPU probe's setting)."""
    lr: float = Field(default=5e-4, gt=0)
    """AdamW learning rate (5e-4: the measured CPU probe's setting, with LoRA r16)."""
    batch_size: int = Field(default=16, ge=1)
    """Demonstrations (transitions) per optimizer step."""
    token_budget: int | None = Field(default=None, ge=64)
    """Max padded tokens per micro-batch; default ``optim.token_budget``."""
    grad_clip: float = Field(default=1.0, gt=0)
    """Max global gradient norm."""
    validate_before: bool = True
    """Validate the base model (greedy, ``tasks.val`` up to ``limit_val``) before the warm
    start: the "base" row of a before/after table. ``boltrl sft`` also validates after."""

    def resolved(self, resolve: Callable[[str | None], str | None]) -> WarmStartConfig:
        """A copy with its file paths resolved by ``resolve`` (relative to the config)."""
        update: dict[str, Any] = {"tasks": resolve(self.tasks)}
        if isinstance(self.teacher, str):
            update["teacher"] = resolve(self.teacher)
        return self.model_copy(update=update)
