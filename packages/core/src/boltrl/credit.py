"""Credit assignment (LightningRL): a finished rollout becomes a list of MDP transitions.

One transition per recorded model call of one attempt (status ``ok``, not ``cached``), in
``seq`` (write) order: state = the prompt token ids the model saw, action = the token ids
it sampled with their logprobs, ``done`` on the last one. Nothing is re-tokenized: a call
without token ids (or logprobs) is refused with :class:`MissingTokenIds`. A demonstration
(``LLMCall.demonstration``: a teacher's reply in the student's tokens) needs token ids but
claims no logprobs: its transition carries ``demonstration`` and 0.0 placeholder logprobs,
for supervised loss only (the RL update refuses it).

Which reward each transition carries (``CreditConfig.mode``):

``final``
    The attempt's final reward on every transition. The final reward is
    ``rollout.reward`` for the rollout's final attempt, else that attempt's last
    ``RewardEvent`` with ``final=True``. When there is none (the agent returned None),
    the sum of the attempt's intermediate rewards is used instead, and 0.0 when there
    are none either. Intermediate rewards are otherwise ignored in this mode; use
    ``discounted`` to train on them.
``discounted``
    Return-to-go ``G_t = sum_{k>=t} gamma^(k-t) r_k`` over the emitted steps, where
    ``r_k`` is the sum of the rewards placed on step ``k``. An intermediate reward
    (``final=False``) is placed on the step of the call it names (``call_id``), else on
    the latest emitted call written at or before it (by ``seq``); a named call that
    is not emitted (another agent's, failed, cached) is positioned by its own ``seq``
    the same way. Rewards before the first emitted call go to the first step. The final
    reward (as above, without the fallback) goes to the last step.

The agent filter (``agents``) emits transitions only for the listed agents' calls; the
other calls stay context (their tokens reach the trained agent only through later
prompts) and rewards near them attach as described above, so that a reward always counts
towards the return of every trained step before it. With ``merge_prefix``, consecutive
emitted calls of the same agent and policy version whose prompt starts with the previous
call's prompt + response ids become one transition: state = the first prompt, action =
response 1 + observation tokens + response 2 + ..., with ``action_mask`` 0 and logprob
0.0 on the observation tokens; any mismatch starts a new transition. A merged transition
is one step for discounting.

The return of a rollout from its start (``rollout_return``) equals the reward of its
first transition in both modes; the trainer's group baselines use it.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from boltrl.errors import InvalidInput
from boltrl.records import LLMCall, RewardEvent, Rollout, Transition

__all__ = [
    "CreditConfig",
    "MissingTokenIds",
    "final_reward",
    "rollout_return",
    "transitions",
    "transitions_batch",
]

CreditMode = Literal["final", "discounted"]
_MODES: tuple[str, ...] = ("final", "discounted")


class MissingTokenIds(InvalidInput):
    """A model call lacks the token ids (or logprobs) a transition needs.

    boltrl never re-tokenizes text to recover ids; serve the model through a backend
    that reports them (the gateway records them for every backend that can).
    """


@dataclass(frozen=True)
class CreditConfig:
    """How a rollout's rewards are credited to its model calls (see the module docstring)."""

    mode: CreditMode = "final"
    """``final``: the final reward on every transition; ``discounted``: return-to-go
    over intermediate rewards and the final reward."""
    gamma: float = 1.0
    """Discount per step for ``discounted``, in [0, 1]; ignored by ``final``."""
    agents: tuple[str, ...] | None = None
    """Allow-list of agent names whose calls become transitions (None: every call).
    Other agents' calls stay context. A list is accepted and stored as a tuple."""
    merge_prefix: bool = False
    """Merge consecutive calls whose prompt extends the previous prompt + response into
    one transition with the observation tokens masked out."""
    attempt: int | None = None
    """Attempt whose records are used (None: the rollout's final attempt)."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CreditConfig:
        """A config from plain settings (a YAML mapping); unknown keys are refused."""
        _check_keys(data)
        return cls(**data)

    def __post_init__(self) -> None:
        if self.mode not in _MODES:
            raise InvalidInput(
                f"credit.mode: must be one of {', '.join(_MODES)} (got {self.mode!r})"
            )
        if isinstance(self.gamma, bool) or not isinstance(self.gamma, int | float):
            raise InvalidInput(f"credit.gamma: must be a number in [0, 1] (got {self.gamma!r})")
        if not 0.0 <= self.gamma <= 1.0:
            raise InvalidInput(f"credit.gamma: must be in [0, 1] (got {self.gamma!r})")
        if self.agents is not None:
            if isinstance(self.agents, str) or not all(isinstance(a, str) for a in self.agents):
                raise InvalidInput(
                    "credit.agents: must be a list of agent names, e.g. ['solver'] "
                    f"(got {self.agents!r})"
                )
            if not self.agents:
                raise InvalidInput(
                    "credit.agents: empty list would train no agent; use None for all agents"
                )
            object.__setattr__(self, "agents", tuple(self.agents))
        if not isinstance(self.merge_prefix, bool):
            raise InvalidInput(
                f"credit.merge_prefix: must be true or false (got {self.merge_prefix!r})"
            )
        if self.attempt is not None and (
            isinstance(self.attempt, bool) or not isinstance(self.attempt, int) or self.attempt < 1
        ):
            raise InvalidInput(
                f"credit.attempt: must be an attempt number >= 1 or None (got {self.attempt!r})"
            )


def _check_keys(data: Mapping[str, Any]) -> None:
    known = [f.name for f in dataclasses.fields(CreditConfig)]
    for key in data:
        if key not in known:
            raise InvalidInput(f"credit.{key}: unknown setting; known: {', '.join(known)}")


def _config(credit: CreditConfig | str, overrides: dict[str, Any]) -> CreditConfig:
    _check_keys(overrides)
    if isinstance(credit, CreditConfig):
        return dataclasses.replace(credit, **overrides) if overrides else credit
    if isinstance(credit, str):
        return CreditConfig(mode=credit, **overrides)  # type: ignore[arg-type]
    raise InvalidInput(f"credit: expected a CreditConfig or a mode name (got {credit!r})")


def _attempt_number(rollout: Rollout, cfg: CreditConfig) -> int | None:
    if cfg.attempt is not None:
        known = {a.number for a in rollout.attempts} | {c.attempt for c in rollout.calls}
        if cfg.attempt not in known:
            raise InvalidInput(
                f"credit.attempt: rollout {rollout.id} has no attempt {cfg.attempt} "
                f"(known: {sorted(known)})"
            )
        return cfg.attempt
    if rollout.final_attempt is not None:
        return rollout.final_attempt
    return max((c.attempt for c in rollout.calls), default=None)


def _check_tokens(rollout: Rollout, call: LLMCall) -> None:
    needed = ("prompt_token_ids", "response_token_ids")
    if call.demonstration is not None:  # claims no behaviour logprobs
        for field in needed:
            if getattr(call, field) is None:
                raise MissingTokenIds(
                    f"rollout {rollout.id}, call {call.id}: demonstration without {field}"
                )
        return
    for field in (*needed, "response_logprobs"):
        if getattr(call, field) is None:
            raise MissingTokenIds(
                f"rollout {rollout.id}, call {call.id}: {field} is missing; boltrl does "
                "not re-tokenize, so serve the model through a backend that reports "
                "token ids and logprobs"
            )
    assert call.response_token_ids is not None and call.response_logprobs is not None
    if len(call.response_logprobs) != len(call.response_token_ids):
        raise InvalidInput(
            f"rollout {rollout.id}, call {call.id}: response_logprobs has "
            f"{len(call.response_logprobs)} entries for {len(call.response_token_ids)} "
            "response_token_ids"
        )


def _extends(prev: LLMCall, call: LLMCall) -> bool:
    """True when ``call``'s prompt starts with ``prev``'s prompt + response ids (never
    for calls without ids: ``rollout_return`` groups steps without requiring them)."""
    if call.agent != prev.agent or call.policy_version != prev.policy_version:
        return False
    if call.demonstration != prev.demonstration:
        return False
    p, r, q = prev.prompt_token_ids, prev.response_token_ids, call.prompt_token_ids
    if p is None or r is None or q is None:
        return False
    lp, lr = len(p), len(r)
    return len(q) >= lp + lr and q[:lp] == p and q[lp : lp + lr] == r


def _steps(kept: list[LLMCall], merge: bool) -> list[list[LLMCall]]:
    """Group the emitted calls into steps (one call each, or merged chains)."""
    if not merge:
        return [[c] for c in kept]
    steps: list[list[LLMCall]] = []
    for call in kept:
        if steps and _extends(steps[-1][-1], call):
            steps[-1].append(call)
        else:
            steps.append([call])
    return steps


def _action(chain: list[LLMCall]) -> tuple[list[int], list[float], list[int]]:
    """Action ids, logprobs and mask of one step; observation tokens get logprob 0, mask 0."""
    ids: list[int] = []
    logps: list[float] = []
    mask: list[int] = []
    seen = 0  # length of the token sequence (prompt + actions) the chain has covered
    for i, call in enumerate(chain):
        p, r, lp = call.prompt_token_ids, call.response_token_ids, call.response_logprobs
        assert p is not None and r is not None
        if lp is None:  # a demonstration: placeholders, never behaviour logprobs
            lp = [0.0] * len(r)
        if i:
            obs = p[seen:]
            ids += obs
            logps += [0.0] * len(obs)
            mask += [0] * len(obs)
        ids += r
        logps += lp
        mask += [1] * len(r)
        seen = len(p) + len(r)
    return ids, logps, mask


def _final_reward(
    rollout: Rollout, attempt: int | None, rewards: list[RewardEvent]
) -> float | None:
    if attempt == rollout.final_attempt or not rollout.attempts:
        if rollout.reward is not None:
            return rollout.reward
    finals = [r.value for r in rewards if r.final]
    return finals[-1] if finals else None


def _step_rewards(
    steps: list[list[LLMCall]],
    all_calls: list[LLMCall],
    rewards: list[RewardEvent],
    final: float | None,
) -> list[float]:
    """Sum of the rewards placed on each step (see the module docstring)."""
    r = [0.0] * len(steps)
    starts = [chain[0].seq for chain in steps]  # sorted: steps follow seq order
    step_of_call: dict[str, int] | None = None
    for ev in rewards:
        if ev.final:
            continue
        pos = ev.seq
        if ev.call_id is not None:
            if step_of_call is None:
                step_of_call = {c.id: i for i, chain in enumerate(steps) for c in chain}
            if ev.call_id in step_of_call:
                r[step_of_call[ev.call_id]] += ev.value
                continue
            # a call that is not emitted (context, failed, cached) positions it by its seq
            pos = next((c.seq for c in all_calls if c.id == ev.call_id), pos)
        r[max(bisect.bisect_right(starts, pos) - 1, 0)] += ev.value
    if final is not None:
        r[-1] += final
    return r


def _returns_to_go(r: list[float], gamma: float) -> list[float]:
    out = r[:]
    for t in range(len(out) - 2, -1, -1):
        out[t] += gamma * out[t + 1]
    return out


def _seq(call: LLMCall) -> int:
    return call.seq


def _credited(
    rollout: Rollout, cfg: CreditConfig, *, check_tokens: bool = True
) -> tuple[list[list[LLMCall]], list[float], float]:
    """The steps of the selected attempt, each step's credited reward, and the return.

    ``check_tokens=False`` computes rewards without requiring token ids (a score needs
    none); transitions always require them."""
    attempt = _attempt_number(rollout, cfg)
    # Same selection as ``rollout.records_of(attempt)``, without copying the rollout.
    if attempt is None:  # nothing was ever recorded under an attempt number
        calls, rewards = sorted(rollout.calls, key=_seq), list(rollout.rewards)
    else:
        calls = sorted((c for c in rollout.calls if c.attempt == attempt), key=_seq)
        rewards = [ev for ev in rollout.rewards if ev.attempt == attempt]
    allowed = None if cfg.agents is None else set(cfg.agents)
    kept = [
        c
        for c in calls
        if c.status == "ok" and not c.cached and (allowed is None or c.agent in allowed)
    ]
    if check_tokens:
        for c in kept:
            _check_tokens(rollout, c)
    steps = _steps(kept, cfg.merge_prefix)
    final = _final_reward(rollout, attempt, rewards)
    if cfg.mode == "final":
        if final is None:
            final = sum(ev.value for ev in rewards if not ev.final)
        return steps, [final] * len(steps), final
    if not steps:
        total = sum(ev.value for ev in rewards if not ev.final) + (final or 0.0)
        return steps, [], total
    credited = _returns_to_go(_step_rewards(steps, calls, rewards, final), cfg.gamma)
    return steps, credited, credited[0]


def transitions(
    rollout: Rollout, credit: CreditConfig | str = "final", **overrides: Any
) -> list[Transition]:
    """The rollout's transitions under ``credit`` (a config or a mode name).

    Keyword ``overrides`` replace config fields, e.g.
    ``transitions(r, "discounted", gamma=0.9, agents=["solver"], merge_prefix=True)``.
    Raises :class:`MissingTokenIds` when an emitted call lacks token ids or logprobs,
    ``InvalidInput`` for a bad config (the message names the field).
    """
    cfg = _config(credit, overrides)
    steps, credited, _ = _credited(rollout, cfg)
    task = rollout.task
    group = task.group if task.group is not None else task.id
    last = len(steps) - 1
    out: list[Transition] = []
    for t, chain in enumerate(steps):
        first = chain[0]
        action, logprobs, mask = _action(chain)
        # The inputs were validated as LLMCall fields; skipping re-validation is 5x faster.
        out.append(
            Transition.model_construct(
                rollout_id=rollout.id,
                task_id=task.id,
                group=group,
                step=t,
                agent=first.agent,
                state=first.prompt_token_ids[:],  # type: ignore[index]
                action=action,
                action_logprobs=logprobs,
                action_mask=mask,
                reward=float(credited[t]),
                done=t == last,
                policy_version=first.policy_version,
                call_ids=[c.id for c in chain],
                demonstration=first.demonstration,
            )
        )
    return out


def transitions_batch(
    rollouts: Iterable[Rollout], credit: CreditConfig | str = "final", **overrides: Any
) -> list[Transition]:
    """All transitions of ``rollouts``, concatenated in rollout order."""
    cfg = _config(credit, overrides)
    out: list[Transition] = []
    for rollout in rollouts:
        out += transitions(rollout, cfg)
    return out


def final_reward(
    rollout: Rollout, credit: CreditConfig | str = "final", **overrides: Any
) -> float | None:
    """The final reward of the attempt ``credit`` selects, by the module's rule (the
    agent's returned reward, else the attempt's last ``final`` reward event), without the
    intermediate rewards; None when there is none. Raises ``InvalidInput`` for an
    attempt the rollout does not have."""
    cfg = _config(credit, overrides)
    attempt = _attempt_number(rollout, cfg)
    rewards = [ev for ev in rollout.rewards if attempt is None or ev.attempt == attempt]
    return _final_reward(rollout, attempt, rewards)


def rollout_return(
    rollout: Rollout, credit: CreditConfig | str = "final", **overrides: Any
) -> float:
    """The rollout's return from its start under ``credit``.

    ``final``: the final reward (with the module's fallback); ``discounted``:
    ``sum_k gamma^k r_k`` over the steps. Equals the first transition's reward when
    there is one; defined (undiscounted) even for a rollout with no emitted calls. Needs
    no token ids (a rollout served without them has a return, but no transitions).
    """
    _, _, ret = _credited(rollout, _config(credit, overrides), check_tokens=False)
    return float(ret)
