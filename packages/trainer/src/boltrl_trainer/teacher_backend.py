"""Demonstrations through the real agent: a Backend that plays the student's part.

``TeacherBackend`` sits where the student model would (behind the real gateway, called by
the user's real agent), so every prompt of a demonstration is exactly what the agent
sends: chat template, tools, history, role names. For each call it asks a teacher for
the assistant reply, then renders that reply into the *student's* token ids with
``StudentRenderer``:

- ``prompt_token_ids``: the request rendered and tokenized exactly as
  ``TransformersBackend`` does (``boltrl_trainer._chat``);
- ``response_token_ids``: what the student's chat template puts in the *next* prompt
  for this assistant turn, up to and including its end-of-turn token: the conversation
  with the reply appended is rendered and tokenized, and the ids after the prompt are
  taken from it. Supervised on these ids, the student learns to write exactly what its
  own later prompts will contain;
- ``text`` / ``tool_calls``: those ids decoded and parsed the way ``TransformersBackend``
  parses its own samples, so the agent sees what the student would have produced;
- no ``response_logprobs`` (a demonstration claims no behaviour logprobs) and
  ``demonstration`` set to where it came from: credit assignment carries that onto the
  transitions, and the RL update refuses them.

Teachers (``Teacher``): a function of the training task's gold data (``FunctionTeacher``,
``teach(task, request) -> reply``) or any OpenAI-compatible model (``ModelTeacher``
around ``boltrl.gateway.upstream.UpstreamBackend``). Either sees training tasks only:
``TaskGuard`` looks each call's rollout up in the store and refuses a task outside the
allowed training set (or tagged with another split) before the teacher is asked.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import threading
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from boltrl._common import JSON
from boltrl.errors import BackendError, InvalidInput
from boltrl.gateway.backend import Backend, Generation, GenerationRequest
from boltrl.records import Task
from boltrl.store.base import Store
from boltrl_trainer import _chat

log = logging.getLogger(__name__)


__all__ = [
    "FunctionTeacher",
    "ModelTeacher",
    "Rendered",
    "Reply",
    "StudentRenderer",
    "TaskGuard",
    "Teacher",
    "TeacherBackend",
    "normalize_reply",
]


@dataclass(frozen=True)
class Reply:
    """An assistant turn as a teacher gives it (OpenAI format)."""

    content: str | None
    tool_calls: list[JSON]
    """``{"id", "type": "function", "function": {"name", "arguments"}}`` (arguments: JSON text)."""


def _tool_call(tc: Any, where: str, i: int) -> JSON:
    if not isinstance(tc, dict):
        raise InvalidInput(f"{where}.tool_calls[{i}]: must be an object")
    fn = tc.get("function", tc)
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str) or not name:
        raise InvalidInput(f"{where}.tool_calls[{i}]: needs a string 'name'")
    args = fn.get("arguments", {})
    return {
        "id": str(tc.get("id") or f"call_{i}"),
        "type": "function",
        "function": {
            "name": name,
            "arguments": args if isinstance(args, str) else json.dumps(args),
        },
    }


def normalize_reply(value: Any, where: str = "teacher reply") -> Reply:
    """A teacher's answer as a ``Reply``: a string (text), or ``{"content"?, "tool_calls"?}``
    whose calls are ``{"name", "arguments"}`` (arguments an object or a JSON string) or
    OpenAI's ``{"function": {...}}`` form. Raises ``InvalidInput`` naming what is wrong."""
    if isinstance(value, Reply):
        return value
    if isinstance(value, str):
        return Reply(value, [])
    if not isinstance(value, dict):
        raise InvalidInput(
            f"{where}: must be a string or {{'content', 'tool_calls'}} (got {type(value).__name__})"
        )
    unknown = set(value) - {"content", "tool_calls", "role"}
    if unknown:
        raise InvalidInput(f"{where}: unknown keys {sorted(unknown)}")
    content = value.get("content")
    if content is not None and not isinstance(content, str):
        raise InvalidInput(f"{where}.content: must be a string")
    calls = [_tool_call(tc, where, i) for i, tc in enumerate(value.get("tool_calls") or [])]
    if not content and not calls:
        raise InvalidInput(f"{where}: has neither content nor tool_calls")
    return Reply(content, calls)


@dataclass(frozen=True)
class Rendered:
    """A reply rendered in the student's tokens."""

    prompt_ids: list[int]
    reply_ids: list[int]
    """Ids of the assistant turn as the next prompt holds them, end-of-turn token included."""
    text: str | None
    tool_calls: list[JSON]
    template_hash: str


class StudentRenderer:
    """Renders prompts and replies with the student's tokenizer and chat template.

    ``eos_ids``: the ids that end a student reply (what ``TransformersBackend`` stops on:
    the model's ``generation_config.eos_token_id`` and the tokenizer's EOS). Thread-safe:
    the tokenizer is only read.
    """

    def __init__(self, tokenizer: Any, eos_ids: Iterable[int] | None = None) -> None:
        from boltrl_trainer.models import ensure_chat_template

        ensure_chat_template(tokenizer)
        self.tokenizer = tokenizer
        ids = set(eos_ids or ())
        if tokenizer.eos_token_id is not None:
            ids.add(int(tokenizer.eos_token_id))
        if not ids:
            raise InvalidInput("tokenizer: has no EOS token; cannot tell where a reply ends")
        self.eos_ids = frozenset(ids)

    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def prompt(self, request: GenerationRequest) -> tuple[list[int], str]:
        """``(prompt_ids, template_hash)`` exactly as ``TransformersBackend`` renders them."""
        text, template_hash = _chat.render(
            self.tokenizer, request.messages, request.tools, request.tool_choice
        )
        return self._ids(text), template_hash

    def render(self, request: GenerationRequest, reply: Reply) -> Rendered:
        """The reply in the student's ids (see the module docstring).

        Raises ``InvalidInput`` when the template does not extend the prompt with the
        reply (the prompt's ids are not a prefix of the next prompt's), writes no
        end-of-turn token after it, or the request has no tools for a tool call.
        """
        parse_tools = bool(request.tools) and request.tool_choice != "none"
        if reply.tool_calls and not parse_tools:
            raise InvalidInput("teacher reply: has tool_calls but the request offers no tools")
        prompt_ids, template_hash = self.prompt(request)
        message: JSON = {"role": "assistant", "content": reply.content}
        if reply.tool_calls:
            message["tool_calls"] = reply.tool_calls
        following, _ = _chat.render(
            self.tokenizer, [*request.messages, message], request.tools, request.tool_choice
        )
        full = self._ids(following)
        n = len(prompt_ids)
        if full[:n] != prompt_ids:
            raise InvalidInput(
                "teacher reply: the student's chat template does not render the next prompt "
                "as this prompt + the reply (the reply's first characters merge with the "
                "prompt's last token, or the template rewrites earlier turns)"
            )
        end = next((i for i in range(n, len(full)) if full[i] in self.eos_ids), None)
        if end is None:
            raise InvalidInput(
                "teacher reply: the student's chat template writes no end-of-turn token "
                f"(one of {sorted(self.eos_ids)}) after the assistant turn"
            )
        reply_ids = full[n : end + 1]
        text = str(self.tokenizer.decode(reply_ids[:-1], skip_special_tokens=True))
        content: str | None = text
        calls: list[JSON] = []
        if parse_tools:  # what TransformersBackend would hand the agent for these ids
            content, calls = _chat.parse_tool_calls(text)
        if len(calls) != len(reply.tool_calls):
            raise InvalidInput(
                f"teacher reply: {len(reply.tool_calls)} tool call(s) rendered, but the "
                f"student's rendering parses back to {len(calls)}"
            )
        return Rendered(prompt_ids, reply_ids, content, calls, template_hash)


class Teacher(Protocol):
    """Produces the assistant reply for one call of a training task.

    Promises: may be awaited concurrently; raises ``InvalidInput`` / ``BackendError``
    when it has no reply (the call, hence the rollout, fails and yields no demonstration).
    """

    @property
    def source(self) -> str:
        """Where its demonstrations come from (recorded as their provenance)."""
        ...

    async def reply(self, task: Task, request: GenerationRequest) -> Reply: ...

    async def aclose(self) -> None: ...


class FunctionTeacher:
    """A teacher function ``teach(task, request) -> str | {"content", "tool_calls"}``.

    ``task`` is the training task's input (what the agent receives, gold data included),
    ``request`` the ``GenerationRequest`` the agent sent. A sync function runs on a worker
    thread; an async one is awaited.
    """

    def __init__(self, fn: Callable[[JSON, GenerationRequest], Any], source: str) -> None:
        self.fn = fn
        self._source = source

    @property
    def source(self) -> str:
        return self._source

    async def reply(self, task: Task, request: GenerationRequest) -> Reply:
        if inspect.iscoroutinefunction(self.fn):
            value = await self.fn(task.input, request)
        else:
            value = await asyncio.to_thread(self.fn, task.input, request)
        if value is None:
            raise BackendError(f"teacher {self._source}: no reply for task {task.id!r}")
        return normalize_reply(value, f"teacher {self._source} (task {task.id!r})")

    async def aclose(self) -> None:
        """Nothing to release."""


class ModelTeacher:
    """Any OpenAI-compatible model as the teacher (``UpstreamBackend`` or another Backend).

    The teacher model sees the agent's request as sent (messages and tools); its reply's
    text and tool calls are re-rendered in the student's tokens by ``TeacherBackend``.
    """

    def __init__(self, backend: Backend, source: str) -> None:
        self.backend = backend
        self._source = source

    @property
    def source(self) -> str:
        return self._source

    async def reply(self, task: Task, request: GenerationRequest) -> Reply:
        gen = await self.backend.generate(request.model_copy(update={"model": None}))
        if gen.finish_reason == "length":
            raise BackendError(f"teacher {self._source}: reply cut at max_tokens")
        content = gen.text.strip() if gen.text else gen.text
        return normalize_reply(
            {"content": content, "tool_calls": gen.tool_calls}, f"teacher {self._source}"
        )

    async def aclose(self) -> None:
        await self.backend.aclose()


class TaskGuard:
    """Finds each call's task through the store and lets only training tasks through.

    ``allowed``: the ids of the tasks the teacher may see; ``split``: the split those
    tasks must be tagged with (``Task.split``). Thread-safe.
    """

    def __init__(self, store: Store, allowed: Collection[str], *, split: str = "train") -> None:
        self.store = store
        self.allowed = frozenset(allowed)
        self.split = split
        self._tasks: dict[str, Task] = {}
        self._lock = threading.Lock()

    def check(self, task: Task) -> Task:
        """``task`` when a teacher may see it; raises ``BackendError`` otherwise."""
        if task.id not in self.allowed or task.split != self.split:
            raise BackendError(
                f"teacher refused task {task.id!r} (split {task.split!r}): teachers see "
                f"the warm start's {self.split} tasks only, never val/test"
            )
        return task

    async def task_of(self, rollout_id: str | None) -> Task:
        if rollout_id is None:
            raise BackendError("teacher: a call outside a rollout has no task to demonstrate")
        with self._lock:
            task = self._tasks.get(rollout_id)
        if task is None:
            task = (await asyncio.to_thread(self.store.get, rollout_id)).task
            with self._lock:
                self._tasks[rollout_id] = task
        return self.check(task)


class TeacherBackend:
    """A ``Backend`` serving a teacher's replies in the student's tokens (module docstring).

    ``model_name`` is what the gateway serves (the student's name, so the agent runs as
    it would against the student). Promises: ``generate`` may be awaited concurrently;
    it raises ``BackendError`` when the task is not a training task, the teacher has no
    reply, or the reply cannot be rendered (or is longer than the request's
    ``max_tokens`` in student tokens: the student could never write it whole).
    """

    def __init__(
        self,
        teacher: Teacher,
        renderer: StudentRenderer,
        guard: TaskGuard,
        *,
        model_name: str = "policy",
    ) -> None:
        self.teacher = teacher
        self.renderer = renderer
        self.guard = guard
        self._name = model_name
        self.policy_version = 0
        self.counts = {"served": 0, "refused": 0}

    @property
    def model_name(self) -> str:
        return self._name

    async def generate(self, request: GenerationRequest) -> Generation:
        try:
            task = await self.guard.task_of(request.rollout_id)
            reply = await self.teacher.reply(task, request)
            out = await asyncio.to_thread(self.renderer.render, request, reply)
        except (InvalidInput, BackendError) as e:
            self.counts["refused"] += 1
            log.warning("no demonstration for rollout %s: %s", request.rollout_id, e)
            raise BackendError(str(e)) from e
        if request.max_tokens is not None and len(out.reply_ids) > request.max_tokens:
            self.counts["refused"] += 1
            raise BackendError(
                f"teacher reply is {len(out.reply_ids)} student tokens; max_tokens is "
                f"{request.max_tokens} (raise max_tokens, or the student cannot write it)"
            )
        self.counts["served"] += 1
        return Generation(
            text=out.text,
            tool_calls=out.tool_calls,
            finish_reason="tool_calls" if out.tool_calls else "stop",
            prompt_token_ids=out.prompt_ids,
            response_token_ids=out.reply_ids,
            response_logprobs=None,  # a demonstration claims no behaviour logprobs
            template_hash=out.template_hash,
            model=self._name,
            demonstration=self.teacher.source,
            usage={
                "prompt_tokens": len(out.prompt_ids),
                "completion_tokens": len(out.reply_ids),
                "total_tokens": len(out.prompt_ids) + len(out.reply_ids),
            },
        )

    async def aclose(self) -> None:
        await self.teacher.aclose()
