"""The Backend contract: what serves the gateway's model calls."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from boltrl._common import JSON


class GenerationRequest(BaseModel):
    """A chat request, normalized from either OpenAI API shape (chat or responses)."""

    model_config = ConfigDict(extra="forbid")

    messages: list[JSON]
    """OpenAI chat messages (system/user/assistant/tool; assistant ``tool_calls``)."""
    tools: list[JSON] | None = None
    """OpenAI chat tools: ``[{"type": "function", "function": {name, parameters…}}]``."""
    tool_choice: Any = None
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    stop: list[str] = Field(default_factory=list)
    seed: int | None = None
    model: str | None = None
    rollout_id: str | None = None
    """The rollout the call belongs to (None for unrecorded ``/v1`` calls)."""


class Generation(BaseModel):
    """What a backend produced for one request."""

    model_config = ConfigDict(extra="forbid")

    text: str | None
    """Assistant text content (None when the reply is only tool calls)."""
    tool_calls: list[JSON] = Field(default_factory=list)
    """OpenAI-format tool calls: ``{"id", "type": "function", "function": {"name", "arguments"}}``
    with ``arguments`` a JSON string."""
    finish_reason: str = "stop"
    """``stop``, ``length`` or ``tool_calls``."""
    prompt_token_ids: list[int] | None = None
    """Exactly the ids fed to the model; None when the backend cannot know them."""
    response_token_ids: list[int] | None = None
    """Exactly the ids sampled; None when the backend cannot know them."""
    response_logprobs: list[float] | None = None
    """Logprob of each sampled id under the sampling distribution."""
    policy_version: int | None = None
    template_hash: str | None = None
    model: str | None = None
    usage: dict[str, int] = Field(default_factory=dict)
    demonstration: str | None = None
    """Set by a backend that plays the model's part with a teacher's reply (where it came
    from); recorded as ``LLMCall.demonstration``. None for a policy's own sample."""


@runtime_checkable
class Backend(Protocol):
    """Serves model calls for the gateway.

    Promises:
    - ``generate`` is a coroutine that may be awaited concurrently by many requests; a
      backend that batches does so internally.
    - It returns exact token ids and logprobs when it can, and None for them (never
      guessed, never re-tokenized) when it cannot.
    - Failure raises ``boltrl.errors.BackendError`` (or ``BackendUnavailable``); any other
      exception is treated the same way by the gateway.
    """

    @property
    def model_name(self) -> str:
        """The name served under ``/v1/models``."""
        ...

    @property
    def policy_version(self) -> int:
        """Version of the weights now served (bumped by the trainer after each update)."""
        ...

    async def generate(self, request: GenerationRequest) -> Generation:
        """Produce one assistant turn for the request."""
        ...

    async def aclose(self) -> None:
        """Release resources. Idempotent."""
        ...
