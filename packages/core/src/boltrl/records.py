"""The records every part of boltrl speaks. Defined here once; everything else imports them.

All records are frozen pydantic models that serialize to JSON losslessly
(``Model.model_validate_json(m.model_dump_json()) == m``). Records that a rollout
accumulates (``LLMCall``, ``CallAnnotation``, ``ToolStep``, ``RewardEvent``) carry a
``kind`` discriminator so a mixed list travels as one JSON array (see ``AnyRecord``)
and an ``id`` that makes writing them idempotent: writing the same id twice keeps the
first write.
"""

from __future__ import annotations

import enum
import math
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator

from boltrl._common import JSON as JSON
from boltrl._common import new_id as new_id

SCHEMA_VERSION = 1
"""Bumped whenever a record changes shape; stored with every serialized rollout."""


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Task(_Record):
    """One unit of work for the agent."""

    id: str = Field(default_factory=lambda: new_id("task"))
    """Stable task id; rollouts of the same task form a GRPO group."""
    input: JSON
    """What the agent receives as its ``task`` argument (any JSON object)."""
    group: str | None = None
    """Optional grouping key for advantage baselines; defaults to ``id`` when None."""
    split: str | None = None
    """Optional split name (``train``, ``val``, ``test``)."""
    metadata: JSON = Field(default_factory=dict)
    """Free-form JSON the trainer or user wants to keep next to the task."""


class RolloutStatus(enum.StrEnum):
    """Lifecycle of a rollout: queued → running → succeeded | failed | cancelled.

    ``requeued`` is a queued rollout that already had at least one attempt.
    """

    QUEUED = "queued"
    RUNNING = "running"
    REQUEUED = "requeued"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (RolloutStatus.SUCCEEDED, RolloutStatus.FAILED, RolloutStatus.CANCELLED)


class AttemptOutcome(enum.StrEnum):
    """How one attempt ended (``running`` while it has not)."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMEOUT = "timeout"
    LEASE_EXPIRED = "lease_expired"
    CANCELLED = "cancelled"


class Attempt(_Record):
    """One try at running a rollout, held by one worker under a lease."""

    rollout_id: str
    """The rollout this attempt belongs to."""
    number: int = Field(ge=1)
    """Attempt number, 1-based; records written under it stay separate from other attempts."""
    worker_id: str
    """The runner (worker) that claimed it."""
    started_at: float
    """Unix time of the claim."""
    lease_expires_at: float
    """Unix time after which, without a heartbeat, the attempt is considered lost."""
    last_heartbeat: float
    """Unix time of the last heartbeat (== started_at until the first one)."""
    outcome: AttemptOutcome = AttemptOutcome.RUNNING
    """How it ended; ``running`` while it has not."""
    ended_at: float | None = None
    """Unix time it ended, if it did."""
    error_kind: str | None = None
    """Short machine-readable cause of failure (``exception``, ``timeout``, ``lease_expired``…)."""
    error: str | None = None
    """Human-readable error, with the traceback when the agent raised."""
    task: Task | None = None
    """The task, filled in on ``claim`` so a runner needs no second round trip."""
    timeout_s: float | None = None
    """The rollout's wall-clock budget, copied here for the runner to enforce."""
    token: str | None = None
    """The lease token: an unguessable secret that ``claim`` hands to the claiming worker.
    Every write of the attempt (heartbeat, record, finish, the gateway's recorded route)
    must carry it, so an attempt that was replaced, or an ``Attempt`` nobody claimed,
    cannot write into the rollout. Stores leave it out (None) of what ``get``, ``query``,
    ``wait`` and ``current_attempt`` return."""

    @property
    def key(self) -> str:
        return f"{self.rollout_id}#{self.number}"

    @property
    def route(self) -> str:
        """The gateway path of this attempt's recorded calls (without ``/v1``):
        ``/rollouts/{rollout_id}/attempts/{number}/{token}``. Raises ValueError for an
        attempt without a token (one that did not come from ``claim``)."""
        if not self.token:
            raise ValueError(
                f"attempt {self.number} of rollout {self.rollout_id!r} has no lease token: "
                "use the Attempt that store.claim returned"
            )
        return f"/rollouts/{self.rollout_id}/attempts/{self.number}/{self.token}"


class _RolloutRecord(_Record):
    """What every record a rollout accumulates carries first: which record it is, where
    it falls in the store's write order, its id, and the rollout attempt it belongs to.
    Each subclass narrows ``kind`` to its own literal and gives ``id`` its default."""

    kind: str
    """The discriminator of ``AnyRecord``."""
    seq: int = 0
    """Global write order, assigned by the store on first write (0 before); orders calls,
    tool steps and rewards against each other."""
    id: str
    """Unique per record; writing the same id twice keeps the first write."""
    rollout_id: str = ""
    attempt: int = 0
    """Filled in by the rollout context when recorded."""


class LLMCall(_RolloutRecord):
    """One model call as the gateway served it: the token-level truth of the rollout."""

    kind: Literal["llm_call"] = "llm_call"
    id: str
    """The response id the gateway returned (``chatcmpl-…`` / ``resp_…``); adapters join on it."""
    rollout_id: str
    attempt: int = Field(ge=1)
    """Attempt number the call was made under."""
    agent: str | None = None
    """Agent / role that made the call (filled by joining an adapter's annotation)."""
    parent_id: str | None = None
    """Parent in the call tree (framework span or another call id), from the adapter."""
    request: JSON = Field(default_factory=dict)
    """The request as sent: ``messages`` (OpenAI format), ``tools``, sampling params."""
    response: JSON = Field(default_factory=dict)
    """The response: ``message`` (OpenAI assistant message, ``tool_calls``), ``finish_reason``."""
    prompt_token_ids: list[int] | None = None
    """Token ids exactly as fed to the model; None when the backend could not tell."""
    response_token_ids: list[int] | None = None
    """Token ids exactly as sampled; None when the backend could not tell."""
    response_logprobs: list[float] | None = None
    """Logprob of each sampled token under the sampling distribution."""
    policy_version: int | None = None
    """Version of the weights that served the call."""
    template_hash: str | None = None
    """Hash of the chat template used to render ``prompt_token_ids``."""
    model: str | None = None
    """Model name the backend reported."""
    usage: dict[str, int] = Field(default_factory=dict)
    """``prompt_tokens`` / ``completion_tokens`` / ``total_tokens``."""
    started_at: float = 0.0
    ended_at: float = 0.0
    status: Literal["ok", "failed"] = "ok"
    """``failed`` when the backend failed; such a call has no response tokens."""
    error: str | None = None
    cached: bool = False
    """True when the framework answered from its own cache (never reached the model)."""
    demonstration: str | None = None
    """Where the reply came from when it is a demonstration (a teacher played the model's
    part, its reply rendered in the student's tokens), e.g. ``function:teacher.py:teach``;
    None when the served policy sampled it. A demonstration claims no behaviour logprobs:
    it is for supervised loss only (``boltrl sft``), never an on-policy RL sample."""

    @property
    def has_tokens(self) -> bool:
        return self.prompt_token_ids is not None and self.response_token_ids is not None


class CallAnnotation(_RolloutRecord):
    """What an adapter knows about one model call, joined onto the gateway's ``LLMCall``.

    Joined by ``call_id`` (the response id) when the framework exposes it; otherwise by
    order and content within the rollout (``request_messages``). Never by timestamp.
    """

    kind: Literal["call_annotation"] = "call_annotation"
    id: str = Field(default_factory=lambda: new_id("ann"))
    call_id: str | None = None
    """Response id of the gateway call, when the framework exposes it."""
    span_id: str | None = None
    """The framework's own id for this call (LangChain run id, span id…)."""
    parent_id: str | None = None
    """The framework's id of the parent (graph node, agent span, another call)."""
    agent: str | None = None
    """Agent / role name (LangGraph node, Agents SDK agent, AutoGen source, DSPy predictor)."""
    framework: str | None = None
    """``langchain``, ``openai-agents``, ``autogen``, ``dspy``…"""
    request_messages: list[JSON] | None = None
    """The request messages in OpenAI form, used for joining when ``call_id`` is unknown."""
    response: JSON | None = None
    """The response as the framework saw it."""
    cached: bool = False
    """True when the framework answered from a cache; such a call has no gateway record."""
    index: int = 0
    """Order of this annotation within its rollout attempt (set by the context)."""


class ToolStep(_RolloutRecord):
    """One tool execution."""

    kind: Literal["tool_step"] = "tool_step"
    id: str = Field(default_factory=lambda: new_id("tool"))
    name: str
    arguments: Any = None
    """Arguments as JSON (a dict for function tools, a string when the framework gives one)."""
    result: Any = None
    """The tool's result as JSON (stringified when not JSON-serializable)."""
    error: str | None = None
    """Error message when the tool raised."""
    parent_id: str | None = None
    """The call that requested the tool (response id) or the framework span it ran under."""
    call_id: str | None = None
    """Response id of the model call that asked for this tool, when known."""
    tool_call_id: str | None = None
    """The OpenAI ``tool_call.id`` it answers, when known."""
    agent: str | None = None
    started_at: float = 0.0
    ended_at: float = 0.0
    index: int = 0


class RewardEvent(_RolloutRecord):
    """A reward that arrived during (or at the end of) a rollout."""

    kind: Literal["reward"] = "reward"
    id: str = Field(default_factory=lambda: new_id("rew"))
    value: float
    name: str = "reward"
    call_id: str | None = None
    """The model call this reward refers to, if any; else it applies from its position on."""
    index: int = 0
    """Order among the rollout's records; credit assignment places the reward by it."""
    timestamp: float = 0.0
    final: bool = False
    """True for the final reward (the agent's return value)."""

    @field_validator("value")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("reward value must be a finite number (got NaN or infinity)")
        return v


AnyRecord = Annotated[
    LLMCall | CallAnnotation | ToolStep | RewardEvent, Field(discriminator="kind")
]
"""One record of a rollout; ``kind`` tells which."""

RECORDS_ADAPTER: TypeAdapter[list[AnyRecord]] = TypeAdapter(list[AnyRecord])
RECORD_ADAPTER: TypeAdapter[AnyRecord] = TypeAdapter(AnyRecord)


class Rollout(_Record):
    """A task's run through the agent, with everything recorded about it."""

    schema_version: int = SCHEMA_VERSION
    id: str
    task: Task
    status: RolloutStatus
    max_attempts: int = 3
    timeout_s: float | None = None
    created_at: float = 0.0
    finished_at: float | None = None
    reward: float | None = None
    """Final reward (the agent's return value), if any."""
    error: str | None = None
    """Last error, when failed."""
    attempts: list[Attempt] = Field(default_factory=list)
    calls: list[LLMCall] = Field(default_factory=list)
    """Gateway calls of all attempts, in order, with adapter annotations joined in."""
    tool_steps: list[ToolStep] = Field(default_factory=list)
    rewards: list[RewardEvent] = Field(default_factory=list)
    annotations: list[CallAnnotation] = Field(default_factory=list)
    """Raw adapter annotations (joined ones included), for inspection."""
    unjoined_calls: int = 0
    """Adapter annotations that matched no gateway call (cached calls excluded)."""

    @property
    def attempt_count(self) -> int:
        return len(self.attempts)

    def records_of(self, attempt: int) -> Rollout:
        """This rollout restricted to one attempt's records."""
        return self.model_copy(
            update={
                "calls": [c for c in self.calls if c.attempt == attempt],
                "tool_steps": [t for t in self.tool_steps if t.attempt == attempt],
                "rewards": [r for r in self.rewards if r.attempt == attempt],
                "annotations": [a for a in self.annotations if a.attempt == attempt],
            }
        )

    @property
    def final_attempt(self) -> int | None:
        """Number of the attempt that decided the outcome (the last one)."""
        return self.attempts[-1].number if self.attempts else None


class Transition(_Record):
    """The unified MDP record the trainer consumes: one (state, action, reward) step."""

    rollout_id: str
    task_id: str
    group: str
    """Advantage group (the task's ``group`` or its id)."""
    step: int
    """Index of this transition within its rollout."""
    agent: str | None
    state: list[int]
    """Prompt token ids (the exact ids the model saw)."""
    action: list[int]
    """Response token ids (with observation tokens inside when prefix-merged; see mask)."""
    action_logprobs: list[float]
    """Logprob of each ``action`` token at sampling time (0.0 for masked tokens)."""
    action_mask: list[int]
    """1 for tokens the policy sampled (trained on), 0 for observation tokens."""
    reward: float
    """Credited reward for this step."""
    done: bool
    policy_version: int | None
    call_ids: list[str]
    """Gateway call ids merged into this transition."""
    demonstration: str | None = None
    """The calls' ``LLMCall.demonstration`` when they are demonstrations (then
    ``action_logprobs`` are 0.0 placeholders, not behaviour logprobs): supervised loss
    only; the RL update refuses such transitions. None for policy samples."""


class LLM(_Record):
    """What an agent hands its framework's OpenAI client."""

    base_url: str
    """Attempt-scoped OpenAI base URL:
    ``{gateway}/rollouts/{rollout_id}/attempts/{number}/{token}/v1`` (see ``Attempt.route``)."""
    model: str
    api_key: str = "boltrl"
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    rollout_id: str | None = None

    @property
    def sampling(self) -> JSON:
        """Sampling parameters that are set, in OpenAI request form."""
        out: JSON = {}
        if self.temperature is not None:
            out["temperature"] = self.temperature
        if self.top_p is not None:
            out["top_p"] = self.top_p
        if self.max_tokens is not None:
            out["max_tokens"] = self.max_tokens
        return out


class Resources(_Record):
    """What the trainer publishes so runners (even remote ones) know where the model is."""

    gateway_url: str | None = None
    """Base URL of the gateway (without ``/rollouts/...``)."""
    model: str = "policy"
    api_key: str = "boltrl"
    policy_version: int = 0
    sampling: JSON = Field(default_factory=dict)
    extra: JSON = Field(default_factory=dict)
    version: int = 0
    """Incremented by the store on each publish."""

    def llm_for(self, rollout_id: str, attempt: Attempt | None = None) -> LLM:
        """The ``LLM`` of one rollout: recorded under ``attempt`` (its fenced route) when
        given; without one the base URL is the tokenless ``/rollouts/{id}/v1``, which the
        gateway serves but refuses to record."""
        if self.gateway_url is None:
            raise ValueError("no gateway_url published: call store.publish_resources first")
        base = self.gateway_url.rstrip("/")
        route = attempt.route if attempt is not None else f"/rollouts/{rollout_id}"
        s = self.sampling
        return LLM(
            base_url=f"{base}{route}/v1",
            model=self.model,
            api_key=self.api_key,
            temperature=s.get("temperature"),
            top_p=s.get("top_p"),
            max_tokens=s.get("max_tokens"),
            rollout_id=rollout_id,
        )
