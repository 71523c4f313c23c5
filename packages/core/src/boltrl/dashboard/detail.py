"""The rollout detail view: head, attempts, the trace tree with each call's transition
(credited reward, advantage estimate) — everything as plain JSON values the page shows
as text."""

from __future__ import annotations

import math
import statistics
from typing import Any

from boltrl.credit import CreditConfig, transitions
from boltrl.dashboard.model import HeadInfo
from boltrl.dashboard.tree import Node, build_tree
from boltrl.errors import InvalidInput
from boltrl.records import LLMCall, RewardEvent, Rollout, ToolStep
from boltrl.scoring import rollout_score

_STD_EPS = 1e-6
"""As the trainer's GRPO (``GRPOConfig.std_eps``)."""
_SAMPLING = ("temperature", "top_p", "max_tokens", "seed", "stop", "tool_choice", "stream")


def _advantage(group: list[float]) -> dict[str, Any] | None:
    """GRPO's baseline and scale for a group of final rewards (None below two)."""
    if len(group) < 2:
        return None
    mean = statistics.fmean(group)
    std = statistics.stdev(group)
    return {"group_size": len(group), "mean": mean, "std": std}


def _transitions(rollout: Rollout, credit: CreditConfig) -> tuple[dict[str, Any], str | None]:
    """Per call id: its transition's step, credited reward, done and merge size."""
    try:
        found = transitions(rollout, credit)
    except InvalidInput as e:
        return {}, str(e)
    out: dict[str, Any] = {}
    for t in found:
        for cid in t.call_ids:
            out[cid] = {
                "step": t.step,
                "reward": t.reward,
                "done": t.done,
                "merged_calls": len(t.call_ids),
                "action_tokens": sum(t.action_mask),
            }
    return out, None


def _list(v: Any) -> list[Any]:
    return v if isinstance(v, list) else []


def _call(c: LLMCall) -> dict[str, Any]:
    req, resp = c.request, c.response
    message = resp.get("message") if isinstance(resp.get("message"), dict) else {}
    tools = _list(req.get("tools"))
    return {
        "model": c.model,
        "api": req.get("api"),
        "policy_version": c.policy_version,
        "template_hash": c.template_hash,
        "status": c.status,
        "error": c.error,
        "cached": c.cached,
        "usage": c.usage,
        "finish_reason": resp.get("finish_reason"),
        "messages": _list(req.get("messages")),
        "tools": [(t.get("function") or t).get("name") for t in tools if isinstance(t, dict)],
        "params": {k: req[k] for k in _SAMPLING if k in req},
        "response": message,
        "response_tokens": len(c.response_token_ids or []),
        "prompt_tokens": len(c.prompt_token_ids or []),
        "has_tokens": c.has_tokens,
        "mean_logprob": statistics.fmean(c.response_logprobs) if c.response_logprobs else None,
    }


def _node(n: Node, trans: dict[str, Any], adv: dict[str, Any] | None, depth: int) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": n.id,
        "kind": n.kind,
        "attempt": n.attempt,
        "seq": n.seq,
        "start": n.start,
        "end": n.end,
        "agent": n.agent,
        "depth": depth,
    }
    rec = n.record
    if isinstance(rec, LLMCall):
        out["call"] = _call(rec)
        t = trans.get(rec.id)
        out["transition"] = t
        if t is not None and adv is not None:
            scale = adv["std"] + _STD_EPS
            out["advantage"] = {**adv, "value": (t["reward"] - adv["mean"]) / scale}
    elif isinstance(rec, ToolStep):
        out["tool"] = {
            "name": rec.name,
            "arguments": rec.arguments,
            "result": rec.result,
            "error": rec.error,
            "call_id": rec.call_id,
            "tool_call_id": rec.tool_call_id,
        }
    elif isinstance(rec, RewardEvent):
        out["reward"] = {
            "value": rec.value,
            "name": rec.name,
            "final": rec.final,
            "call_id": rec.call_id,
        }
    out["children"] = [_node(c, trans, adv, depth + 1) for c in n.children]
    return out


def rollout_detail(
    rollout: Rollout, head: HeadInfo, group: list[float], credit: CreditConfig
) -> dict[str, Any]:
    """The detail page's JSON for ``rollout`` (``group``: scores of its advantage group,
    for the GRPO estimate; ``reward`` is its score under ``credit``)."""
    trans, trans_error = _transitions(rollout, credit)
    score = rollout_score(rollout, credit)
    finite = [g for g in group if math.isfinite(g)]
    adv = _advantage(finite) if score is not None else None
    task = rollout.task
    outcomes = {a.number: a.outcome.value for a in rollout.attempts}
    tree = [_node(root, trans, adv, 0) for root in build_tree(rollout)]
    for root in tree:
        root["outcome"] = outcomes.get(root["attempt"])
    return {
        "id": rollout.id,
        "status": rollout.status.value,
        "task": {
            "id": task.id,
            "input": task.input,
            "group": task.group,
            "split": task.split,
            "metadata": task.metadata,
        },
        "run": head.run,
        "phase": head.phase,
        "step": head.step,
        "reward": score,
        "error": rollout.error,
        "created_at": rollout.created_at,
        "finished_at": rollout.finished_at,
        "max_attempts": rollout.max_attempts,
        # A running attempt's lease token (in the raw SQLite head) is not for display.
        "attempts": [a.model_dump(exclude={"task", "token"}) for a in rollout.attempts],
        "unjoined_calls": rollout.unjoined_calls,
        "counts": {
            "calls": len(rollout.calls),
            "tool_steps": len(rollout.tool_steps),
            "rewards": len(rollout.rewards),
        },
        "credit": {"mode": credit.mode, "gamma": credit.gamma, "error": trans_error},
        "advantage_group": adv,
        "tree": tree,
    }
