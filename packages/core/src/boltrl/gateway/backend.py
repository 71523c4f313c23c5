"""The Backend contract: what serves the gateway's model calls.

``Backend.generate`` answers a whole turn. A backend that can hand out the reply's text
while it is being sampled also implements ``StreamingBackend.generate_stream``; the
gateway then streams those pieces to a client that asked for ``stream: true`` and
otherwise (and for every other backend) streams the finished turn in pieces. Either
way the recorded call is the final ``Generation``, the same one ``generate`` returns.
``stream_of`` gives one iterator over both kinds.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
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


@runtime_checkable
class StreamingBackend(Backend, Protocol):
    """A ``Backend`` that can also stream a turn's text as it is sampled (optional).

    Promises of ``generate_stream``, besides ``generate``'s:
    - It yields zero or more ``str`` pieces, then exactly one ``Generation`` (the one
      ``generate`` would have returned for the request: same ids, logprobs, text), and
      nothing after it.
    - The pieces joined are a prefix of that ``Generation.text``: nothing is taken back
      (text a stop string may still cut off, a partly decoded character, anything that
      could yet become a tool call is held until it is certain). Tool calls come only
      in the ``Generation`` (a call is known once parsed), and it may yield no piece at
      all (a reply that opens with a tool call).
    - It raises as ``generate`` does, before or after pieces. A consumer may stop
      iterating at any time (``aclose``); the generation then still finishes on its own.
    """

    def generate_stream(self, request: GenerationRequest) -> AsyncIterator[str | Generation]:
        """The turn's text pieces as they are sampled, then its ``Generation``."""
        ...


async def stream_of(
    backend: Backend, request: GenerationRequest
) -> AsyncIterator[str | Generation]:
    """``backend.generate_stream(request)`` when the backend streams, else one
    ``Generation`` from ``generate``: the same iterator shape for every backend."""
    if isinstance(backend, StreamingBackend):
        async for event in backend.generate_stream(request):
            yield event
        return
    yield await backend.generate(request)
