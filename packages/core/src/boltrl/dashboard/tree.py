"""A rollout's records as a tree: attempts → agent turns → model calls → tool steps,
with rewards where they arrived. Used by the dashboard's trace view and the
OpenTelemetry export alike.

Parents come from the records themselves, never from timing: a call's ``parent_id``
(from the adapter) names another call (by response id, or by the framework span id of
its annotation) or a framework span that recorded nothing of its own (an agent node, a
graph step), which becomes a ``span`` node named after the agent of its first child.
A tool step hangs under its ``parent_id``, else under the call that asked for it
(``call_id``). A reward hangs under the call it names, else under its attempt at its
place in write order. Anything whose parent is unknown hangs under its attempt.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from boltrl.records import LLMCall, RewardEvent, Rollout, ToolStep

NodeKind = Literal["attempt", "span", "call", "tool", "reward"]


@dataclass
class Node:
    """One node of the trace tree."""

    id: str
    """Unique within the rollout: ``attempt:N``, ``span:<framework id>`` or a record id."""
    kind: NodeKind
    attempt: int
    parent: str | None
    seq: int
    """Write order (the smallest of its subtree for spans and attempts)."""
    start: float
    end: float
    agent: str | None = None
    record: LLMCall | ToolStep | RewardEvent | None = None
    children: list[Node] = field(default_factory=list)

    def walk(self) -> list[Node]:
        """This node and its descendants, depth first, children in write order."""
        out = [self]
        for c in self.children:
            out += c.walk()
        return out


def build_tree(rollout: Rollout) -> list[Node]:
    """One root per attempt (in attempt order), each with its subtree."""
    nodes: dict[str, Node] = {}
    alias: dict[str, str] = {}
    """Framework span id → call id, from annotations that name their call."""
    for ann in rollout.annotations:
        if ann.call_id and ann.span_id:
            alias[ann.span_id] = ann.call_id

    numbers = sorted({a.number for a in rollout.attempts} | _record_attempts(rollout))
    started = {a.number: a.started_at for a in rollout.attempts}
    ended = {a.number: a.ended_at or a.last_heartbeat for a in rollout.attempts}
    for n in numbers:
        nodes[f"attempt:{n}"] = Node(
            f"attempt:{n}", "attempt", n, None, 0, started.get(n, 0.0), ended.get(n) or 0.0
        )
    for c in rollout.calls:
        nodes[c.id] = Node(
            c.id, "call", c.attempt, None, c.seq, c.started_at, c.ended_at, c.agent, c
        )
    for t in rollout.tool_steps:
        nodes[t.id] = Node(
            t.id, "tool", t.attempt, None, t.seq, t.started_at, t.ended_at, t.agent, t
        )
    for r in rollout.rewards:
        ts = r.timestamp
        nodes[r.id] = Node(r.id, "reward", r.attempt, None, r.seq, ts, ts, None, r)

    def resolve(parent: str | None, child: Node) -> str:
        root = f"attempt:{child.attempt}"
        if not parent:
            return root
        target = alias.get(parent, parent)
        if target == child.id:
            return root
        if target in nodes:
            found = nodes[target]
            same = found.attempt == child.attempt and found.kind in ("call", "tool", "span")
            return target if same else root
        span_id = f"span:{child.attempt}:{parent}"
        if span_id not in nodes:
            nodes[span_id] = Node(
                span_id, "span", child.attempt, root, child.seq, child.start, child.end, child.agent
            )
        return span_id

    for c in rollout.calls:
        nodes[c.id].parent = resolve(c.parent_id, nodes[c.id])
    for t in rollout.tool_steps:
        nodes[t.id].parent = resolve(t.parent_id or t.call_id, nodes[t.id])
    for r in rollout.rewards:
        node = nodes[r.id]
        node.parent = resolve(r.call_id, node) if r.call_id in nodes else f"attempt:{r.attempt}"

    _break_cycles(nodes)
    for node in nodes.values():
        if node.parent is not None:
            nodes[node.parent].children.append(node)
    roots = [nodes[f"attempt:{n}"] for n in numbers]
    for root in roots:
        _settle(root)
    return roots


def _record_attempts(rollout: Rollout) -> set[int]:
    found = {c.attempt for c in rollout.calls}
    found |= {t.attempt for t in rollout.tool_steps} | {r.attempt for r in rollout.rewards}
    return {n for n in found if n >= 1}


def _break_cycles(nodes: dict[str, Node]) -> None:
    """A parent chain that loops (records naming each other) is cut at its attempt."""
    for node in nodes.values():
        seen = {node.id}
        p = node.parent
        while p is not None:
            if p in seen:
                node.parent = f"attempt:{node.attempt}"
                break
            seen.add(p)
            p = nodes[p].parent


def _settle(node: Node) -> tuple[int, float, float]:
    """Sort children by write order; spans and attempts take their subtree's extent.

    Returns the subtree's (first seq, first start, last end), zeros left out.
    """
    subtree = [_settle(c) for c in node.children]
    node.children.sort(key=lambda c: (c.seq, c.start))
    seqs = [s for s, _, _ in subtree if s > 0]
    starts = [a for _, a, _ in subtree if a > 0]
    ends = [b for _, _, b in subtree if b > 0]
    if node.kind == "span":
        node.seq = min(seqs, default=node.seq)
        node.start = min(starts, default=node.start)
        node.end = max(ends, default=node.end)
        if node.agent is None:
            node.agent = next((c.agent for c in node.children if c.agent), None)
    elif node.kind == "attempt":
        node.start = node.start or min(starts, default=0.0)
        node.end = max([node.end, *ends])
    own = [node.seq] if node.seq > 0 else []
    return (
        min([*own, *seqs], default=0),
        min([x for x in (node.start,) if x > 0] + starts, default=0.0),
        max([node.end, *ends]),
    )
