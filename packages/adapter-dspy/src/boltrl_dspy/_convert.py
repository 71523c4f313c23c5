"""Pure functions from DSPy objects to the pieces of boltrl records.

No SDK state, no rollout context: each function takes DSPy values (callback inputs and
outputs, an LM history entry, a module) and returns JSON-ready Python values. Each reads
defensively, since DSPy has two LM engines (its native lm15 one and LiteLLM) whose
response objects differ.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from boltrl._common import JSON
from boltrl.adapter_support import jsonable as _jsonable


def jsonable(value: Any) -> Any:
    """``value`` as JSON-serializable data (DSPy objects through ``toDict()``)."""
    return _jsonable(value, ("model_dump", "toDict"))


def request_messages(inputs: Mapping[str, Any]) -> list[JSON] | None:
    """The messages of an LM call (``on_lm_start`` inputs) in OpenAI form: DSPy's
    adapters already build OpenAI chat messages; a bare prompt is one user turn."""
    messages = inputs.get("messages")
    if messages is not None:
        out = jsonable(list(messages))
        return out if isinstance(out, list) else None
    prompt = inputs.get("prompt")
    if prompt is not None:
        return [{"role": "user", "content": str(prompt)}]
    return None


_DATA_ATTRS = frozenset({"history", "callbacks", "traces", "train", "demos", "lm"})
"""Module attributes that hold data, never sub-modules (``history`` grows with every
call: DSPy's own ``named_sub_modules`` walks it, which costs milliseconds)."""


def module_paths(root: Any) -> dict[int, str]:
    """``id(module) → path`` for every module under ``root``, named as DSPy names them
    in ``named_predictors()`` (``react``, ``extract.predict``, ``agents[0]``); the root
    itself is named by its class (``ReAct``, or ``Predict`` for a bare predictor)."""
    from dspy.primitives.base_module import BaseModule

    out = {id(root): type(root).__name__}
    queue: list[tuple[Any, str]] = [(root, "")]

    def visit(value: Any, path: str, depth: int) -> None:
        if isinstance(value, BaseModule):
            if id(value) not in out:
                out[id(value)] = path
                queue.append((value, path + "."))
        elif depth < 2 and isinstance(value, list | tuple):
            for i, item in enumerate(value[:256]):
                visit(item, f"{path}[{i}]", depth + 1)
        elif depth < 2 and isinstance(value, dict):
            for i, (key, item) in enumerate(value.items()):
                if i >= 256:
                    break
                visit(item, f"{path}[{key}]", depth + 1)

    while queue:
        module, prefix = queue.pop()
        for name, value in vars(module).items():
            if name not in _DATA_ATTRS:
                visit(value, prefix + name, 0)
    return out


def find_history_entry(
    history: Sequence[Mapping[str, Any]] | None,
    messages: Any,
    prompt: Any,
    claimed: Iterable[str] = (),
    depth: int = 32,
) -> Mapping[str, Any] | None:
    """The LM history entry of the call whose ``messages`` (or ``prompt``) object was
    passed in: DSPy appends the entry before the call returns, keeping that very object.
    Falls back to the latest equal, unclaimed entry (a copy, or a wrapped LM)."""
    if not history:
        return None
    recent: list[Mapping[str, Any]] = list(history[-depth:])
    key = "messages" if messages is not None else "prompt"
    value = messages if messages is not None else prompt
    for entry in recent[::-1]:
        if entry.get(key) is value:
            return entry
    taken = set(claimed)
    for entry in recent[::-1]:
        if entry.get("uuid") not in taken and entry.get(key) == value:
            return entry
    return None


def _first_choice(response: Any) -> Any:
    choices = getattr(response, "choices", None)
    if choices is None and isinstance(response, Mapping):
        choices = response.get("choices")
    return choices[0] if choices else None


def _get(obj: Any, key: str) -> Any:
    if type(obj) is dict or (not hasattr(obj, key) and isinstance(obj, Mapping)):
        return obj.get(key)
    return getattr(obj, key, None)


def response_id(entry: Mapping[str, Any] | None) -> str | None:
    """The provider's response id (``chatcmpl-…``) of a history entry's response."""
    if entry is None:
        return None
    response = entry.get("response")
    if isinstance(response, list | tuple):  # native engine, several responses
        response = response[0] if len(response) == 1 else None
    rid = _get(response, "id")
    return rid if isinstance(rid, str) and rid else None


def finish_reason(entry: Mapping[str, Any] | None) -> str | None:
    if entry is None:
        return None
    response = entry.get("response")
    if isinstance(response, list | tuple):
        response = response[0] if response else None
    reason = _get(response, "finish_reason")
    if reason is None:
        reason = _get(_first_choice(response), "finish_reason")
    return reason if isinstance(reason, str) else None


def is_cache_hit(entry: Mapping[str, Any] | None) -> bool:
    """Whether DSPy answered the call from its cache.

    DSPy clears the usage of a cached result (``CallResult.load`` and the LiteLLM path
    both give ``usage={}``; the LiteLLM path also stamps ``response.cache_hit``). A
    call served by the boltrl gateway always reports usage.
    """
    if entry is None:
        return False
    if getattr(entry.get("response"), "cache_hit", False) is True:
        return True
    return not entry.get("usage")


def response_of(outputs: Any, entry: Mapping[str, Any] | None) -> JSON:
    """The response as an OpenAI assistant ``message`` plus ``finish_reason``, from the
    call's outputs (text, or a dict with ``text`` / ``tool_calls``)."""
    first = outputs[0] if isinstance(outputs, list | tuple) and outputs else outputs
    message: JSON = {"role": "assistant"}
    if isinstance(first, Mapping):
        message["content"] = first.get("text")
        if first.get("tool_calls"):
            message["tool_calls"] = jsonable(first["tool_calls"])
    else:
        message["content"] = None if first is None else str(first)
    return {"message": message, "finish_reason": finish_reason(entry)}


def tool_arguments(inputs: Mapping[str, Any]) -> Any:
    """A tool's arguments from ``on_tool_start`` inputs: its keyword arguments, or the
    positional ones when there are only those."""
    kwargs = inputs.get("kwargs") or {}
    args = inputs.get("args") or ()
    if args and not kwargs:
        return jsonable(list(args))
    if args:
        return {"args": jsonable(list(args)), **jsonable(dict(kwargs))}
    return jsonable(dict(kwargs))


def error_text(error: BaseException) -> str:
    """``Type: message`` of an exception."""
    return f"{type(error).__name__}: {error}"
