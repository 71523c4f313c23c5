"""Warm start pieces on the tiny random model: a teacher's reply rendered in the student's
tokens (round trip, plain text and tool calls), demonstrations through the real OpenAI SDK
and gateway, teachers kept to training tasks, the SFT loss, a teacher model behind a real
gateway with rejection by reward, and the RL update refusing demonstrations."""

from __future__ import annotations

import itertools
import json
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from trainer_harness import collect_demos

from boltrl.credit import transitions
from boltrl.errors import InvalidInput
from boltrl.gateway import Gateway
from boltrl.gateway.backend import GenerationRequest
from boltrl.records import RolloutStatus, Task
from boltrl.store import open_store
from boltrl.testing import ScriptedBackend
from boltrl_trainer.config import TrainConfig, load_config
from boltrl_trainer.demonstrations import Demonstrations, collect, training_tasks
from boltrl_trainer.session import RolloutSession, Sampling, tag_tasks
from boltrl_trainer.teacher_backend import (
    FunctionTeacher,
    Reply,
    StudentRenderer,
    TaskGuard,
    TeacherBackend,
    normalize_reply,
)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a word up in the dictionary.",
            "parameters": {
                "type": "object",
                "properties": {"word": {"type": "string"}},
                "required": ["word"],
            },
        },
    }
]

AGENT = textwrap.dedent(
    """
    from openai import OpenAI

    TOOLS = %s

    def agent(task, llm):
        client = OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
        messages = [
            {"role": "system", "content": "Answer in one word."},
            {"role": "user", "content": task["prompt"]},
        ]
        extra = {"tools": TOOLS} if task.get("word") else {}
        reply = client.chat.completions.create(model=llm.model, messages=messages, **extra)
        msg = reply.choices[0].message
        if msg.tool_calls:  # the agent echoes the call back, as SDK users do
            messages.append(msg.model_dump(exclude_none=True))
            for call in msg.tool_calls:
                messages.append(
                    {"role": "tool", "tool_call_id": call.id, "content": "a greeting"}
                )
            reply = client.chat.completions.create(model=llm.model, messages=messages, **extra)
            msg = reply.choices[0].message
        return 1.0 if (msg.content or "").strip() == task["answer"] else 0.0
    """
) % json.dumps(TOOLS)

TEACHER = textwrap.dedent(
    """
    SEEN = []

    def teach(task, request):
        SEEN.append(task["id"])
        last = request.messages[-1]
        if task.get("word") and last["role"] == "user":
            return {"tool_calls": [{"name": "lookup", "arguments": {"word": task["word"]}}]}
        return task["answer"]
    """
)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory, tiny_model_path: Path) -> Path:
    d = tmp_path_factory.mktemp("sft")
    (d / "agent.py").write_text(AGENT)
    (d / "teacher.py").write_text(TEACHER)
    rows = [{"id": f"t{i}", "prompt": f"Say yes to {i}.", "answer": "yes"} for i in range(6)]
    rows += [
        {"id": f"w{i}", "prompt": f"What is {w}?", "word": w, "answer": "yes"}
        for i, w in enumerate(["hello", "hi"])
    ]
    (d / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    val = [{"id": f"v{i}", "prompt": f"Say yes to {i + 10}.", "answer": "yes"} for i in range(3)]
    (d / "val.jsonl").write_text("".join(json.dumps(r) + "\n" for r in val))
    return d


def _cfg(project: Path, tiny: Path, **warm: Any) -> TrainConfig:
    data = {
        "agent": "agent.py:agent",
        "tasks": {"train": "train.jsonl", "val": "val.jsonl"},
        "model": str(tiny),
        "max_tokens": 48,
        "concurrency": 4,
        "lora": None,
        "progress": False,
        "out_dir": str(project / "out"),
        "warm_start": {"teacher": "teacher.py:teach", **warm},
    }
    path = project / "cfg.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_config(path)  # relative paths resolve against the config's folder


@pytest.fixture(scope="module")
def tokenizer(tiny_model_path: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_path))


def _ids(tok: Any, text: str) -> list[int]:
    return list(tok(text, add_special_tokens=False)["input_ids"])


def test_reply_ids_are_what_the_next_prompt_holds(tokenizer: Any) -> None:
    from boltrl_trainer import _chat

    r = StudentRenderer(tokenizer)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is hello?"},
    ]
    # plain text
    req = GenerationRequest(messages=messages)
    out = r.render(req, Reply("It is a greeting.", []))
    following, _ = _chat.render(
        tokenizer, [*messages, {"role": "assistant", "content": "It is a greeting."}], None, None
    )
    nxt = _ids(tokenizer, following)
    assert out.prompt_ids == _ids(tokenizer, _chat.render(tokenizer, messages, None, None)[0])
    assert nxt[: len(out.prompt_ids) + len(out.reply_ids)] == out.prompt_ids + out.reply_ids
    assert out.reply_ids[-1] == tokenizer.eos_token_id
    assert tokenizer.decode(out.reply_ids) == "It is a greeting.<|im_end|>"
    assert (out.text, out.tool_calls) == ("It is a greeting.", [])

    # a tool call, continued by the tool's result the way an agent sends it back
    req = GenerationRequest(messages=messages, tools=TOOLS)
    reply = normalize_reply({"tool_calls": [{"name": "lookup", "arguments": {"word": "hello"}}]})
    out = r.render(req, reply)
    assert out.text is None
    assert [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in out.tool_calls
    ] == [("lookup", {"word": "hello"})]
    echoed = [
        *messages,
        {"role": "assistant", "content": out.text, "tool_calls": out.tool_calls},
        {"role": "tool", "tool_call_id": out.tool_calls[0]["id"], "content": "a greeting"},
    ]
    nxt = _ids(tokenizer, _chat.render(tokenizer, echoed, TOOLS, None)[0])
    assert nxt[: len(out.prompt_ids) + len(out.reply_ids)] == out.prompt_ids + out.reply_ids
    assert tokenizer.decode(out.reply_ids) == (
        '<tool_call>\n{"name": "lookup", "arguments": {"word": "hello"}}\n</tool_call><|im_end|>'
    )
    # a tool call without tools, and nothing at all, are refused by name
    with pytest.raises(InvalidInput, match="offers no tools"):
        r.render(GenerationRequest(messages=messages), reply)
    with pytest.raises(InvalidInput, match="neither content nor tool_calls"):
        normalize_reply({"content": ""})


def test_demonstrations_through_the_real_sdk_and_gateway(
    project: Path, tiny_model_path: Path, tokenizer: Any
) -> None:
    cfg = _cfg(project, tiny_model_path)
    assert cfg.warm_start is not None

    store = open_store("memory://")
    demos = collect_demos(cfg, tokenizer, store)
    assert (demos.rollouts, demos.kept, demos.failed, demos.rejected) == (8, 8, 0, 0)
    assert demos.source == "function:teacher.py:teach"
    # six one-call rollouts, and two two-call ones each merged into one sequence
    assert len(demos.transitions) == 6 + 2
    assert sum(0 in t.action_mask for t in demos.transitions) == 2
    renderer = StudentRenderer(tokenizer)
    rollouts = [store.get(r.id) for r in store.query(limit=100)]
    assert all(r.status == RolloutStatus.SUCCEEDED and r.reward == 1.0 for r in rollouts)
    for r in rollouts:
        for call in r.calls:
            assert call.demonstration == "function:teacher.py:teach"
            assert call.response_logprobs is None  # no behaviour logprobs claimed
            req = GenerationRequest(
                messages=call.request["messages"], tools=call.request.get("tools")
            )
            assert call.prompt_token_ids == renderer.prompt(req)[0]
            assert call.response_token_ids and call.response_token_ids[-1] == 2
        if len(r.calls) == 2:  # the next prompt holds the demonstrated ids exactly
            first, second = r.calls
            assert first.prompt_token_ids is not None and first.response_token_ids is not None
            head = first.prompt_token_ids + first.response_token_ids
            assert second.prompt_token_ids is not None
            assert second.prompt_token_ids[: len(head)] == head
            merged = transitions(r, "final", merge_prefix=True)
            assert len(merged) == 1 and merged[0].demonstration == first.demonstration
            assert 0 in merged[0].action_mask  # the tool result is context, not a target
    for t in demos.transitions:
        assert t.demonstration == "function:teacher.py:teach"
        assert set(t.action_logprobs) == {0.0}
    store.close()


def test_teachers_never_see_val_or_test(project: Path, tiny_model_path: Path) -> None:
    cfg = _cfg(project, tiny_model_path, tasks="val.jsonl")
    assert cfg.warm_start is not None
    with pytest.raises(InvalidInput, match=r"warm_start.tasks: is tasks.val"):
        training_tasks(cfg, cfg.warm_start)
    mixed = project / "mixed.jsonl"
    val_row = (project / "val.jsonl").read_text().splitlines()[0]
    mixed.write_text((project / "train.jsonl").read_text() + val_row + "\n")
    cfg = _cfg(project, tiny_model_path, tasks=str(mixed))
    assert cfg.warm_start is not None
    with pytest.raises(InvalidInput, match=r"1 task\(s\) are also val tasks \(e.g. 'v0'\)"):
        training_tasks(cfg, cfg.warm_start)

    # call by call: a rollout of a val task reaching the teacher backend is refused
    # before the teacher is asked
    from boltrl.loading import load_object

    seen: list[str] = []

    def teach(task: dict[str, Any], request: GenerationRequest) -> str:
        seen.append(task["id"])
        return "yes"

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_path))
    store = open_store("memory://")
    guard = TaskGuard(store, ["t0", "v0"])  # even when allowed by id, the split decides
    backend = TeacherBackend(FunctionTeacher(teach, "function:test"), StudentRenderer(tok), guard)
    agent = load_object(str(project / "agent.py") + ":agent", what="agent")
    tasks = [
        Task(id="t0", input={"id": "t0", "prompt": "Say yes.", "answer": "yes"}, split="train"),
        Task(id="v0", input={"id": "v0", "prompt": "Say yes.", "answer": "yes"}, split="val"),
        Task(id="t9", input={"id": "t9", "prompt": "Say yes.", "answer": "yes"}, split="train"),
    ]
    session = RolloutSession(
        agent, backend, store, concurrency=2, default_sampling=Sampling(0.0), max_attempts=1
    )
    with session:
        out = session.run(
            tag_tasks(tasks, run="t", step=0, phase="warm_start"), Sampling(0.0), label="x"
        )
    assert [r.status for r in out] == [
        RolloutStatus.SUCCEEDED,
        RolloutStatus.FAILED,
        RolloutStatus.FAILED,
    ]
    assert seen == ["t0"]
    assert "teacher refused task 'v0'" in str(store.get(out[1].id).calls[0].error)
    store.close()


@pytest.fixture(scope="module")
def demos(project: Path, tiny_model_path: Path, tokenizer: Any) -> Demonstrations:
    """The function teacher's demonstrations of the training tasks (8 rollouts)."""
    store = open_store("memory://")
    try:
        return collect_demos(_cfg(project, tiny_model_path), tokenizer, store)
    finally:
        store.close()


def test_sft_loss_falls_on_the_tiny_model(tiny_model_path: Path, demos: Demonstrations) -> None:
    import torch

    from boltrl_trainer.models import load_model
    from boltrl_trainer.sft import SFTBackend

    torch.manual_seed(0)
    model, _ = load_model(tiny_model_path)
    sft = SFTBackend(model, lr=3e-3, pad_id=2, token_budget=256)  # 256: several micro-batches
    before = sft.loss(demos.transitions)
    losses = [sft.step(demos.transitions)["sft/loss"] for _ in range(8)]
    after = sft.loss(demos.transitions)
    assert losses[0] == pytest.approx(before, rel=1e-4)
    assert after < before - 1.0, (before, losses, after)  # nats per trained token
    assert all(b < a for a, b in itertools.pairwise(losses)), losses


@pytest.fixture
def teacher_server() -> Iterator[Gateway]:
    """A "teacher model": a ScriptedBackend behind a real local gateway that answers
    right for even-numbered prompts and wrong for odd ones."""

    def reply(request: GenerationRequest) -> str:
        text = request.messages[-1]["content"]
        n = int("".join(c for c in text if c.isdigit()))
        return "yes" if n % 2 == 0 else "no"

    with Gateway(ScriptedBackend(reply, model="big-teacher")) as gw:
        yield gw


def test_teacher_model_through_upstream_with_rejection_by_reward(
    project: Path, tiny_model_path: Path, tokenizer: Any, teacher_server: Gateway
) -> None:

    teacher = {"base_url": teacher_server.url + "/v1", "model": "big-teacher"}
    cfg = _cfg(project, tiny_model_path, teacher=teacher, min_reward=1.0, limit=6)
    assert cfg.warm_start is not None
    store = open_store("memory://")
    demos = collect_demos(cfg, tokenizer, store)
    assert (demos.rollouts, demos.kept, demos.rejected, demos.failed) == (6, 3, 3, 0)
    assert demos.source == f"model:big-teacher@{teacher_server.url}/v1"
    kept = {t.task_id for t in demos.transitions}
    assert kept == {"t0", "t2", "t4"}
    yes = _ids(tokenizer, "yes<|im_end|>")
    assert all(t.action == yes and t.demonstration == demos.source for t in demos.transitions)
    store.close()


def test_own_successes_from_a_store(project: Path, tiny_model_path: Path, tokenizer: Any) -> None:
    """Expert iteration: the policy's own training rollouts whose reward clears min_reward,
    never its val rollouts, with the ids it sampled (no re-rendering)."""
    from boltrl.loading import load_object
    from boltrl_trainer.models import load_model
    from boltrl_trainer.serving import TransformersBackend

    db = project / "policy.db"
    store = open_store(f"sqlite:///{db}")
    model, tok = load_model(tiny_model_path)
    policy = TransformersBackend(model, tok, max_tokens=6, model_name="policy", seed=0)
    agent = load_object(str(project / "agent.py") + ":agent", what="agent")
    train = [
        Task(
            id=f"t{i}",
            input={"id": f"t{i}", "prompt": f"Say yes to {i}.", "answer": "yes"},
            split="train",
        )
        for i in range(6)
    ]
    val = [Task(id="v0", input={"id": "v0", "prompt": "Say yes.", "answer": "yes"}, split="val")]
    session = RolloutSession(
        agent, policy, store, concurrency=4, default_sampling=Sampling(1.0, max_tokens=6)
    )
    with session:
        out = session.run(
            tag_tasks([*train, *val], run="rl", step=1, phase="train"),
            Sampling(1.0, max_tokens=6),
            label="rl",
        )
    policy.close()
    store.close()
    assert all(r.status == RolloutStatus.SUCCEEDED for r in out)

    # the tiny random model never says "yes": every rollout scored 0.0
    cfg = _cfg(project, tiny_model_path, teacher={"store": f"sqlite:///{db}"}, min_reward=None)
    assert cfg.warm_start is not None
    demos = collect(
        cfg, cfg.warm_start, agent=agent, tokenizer=tokenizer, store=open_store("memory://")
    )
    assert demos.source == f"store:sqlite:///{db}"
    assert (demos.rollouts, demos.kept) == (6, 6)  # the val rollout is never read
    assert {t.task_id for t in demos.transitions} == {t.id for t in train}
    assert all(t.demonstration is None and any(t.action_logprobs) for t in demos.transitions)
    sampled = {c.id: c.response_token_ids for r in out for c in r.calls}
    assert all(t.action == sampled[t.call_ids[0]] for t in demos.transitions)

    cfg = _cfg(project, tiny_model_path, teacher={"store": f"sqlite:///{db}"}, min_reward=0.5)
    assert cfg.warm_start is not None
    demos = collect(
        cfg, cfg.warm_start, agent=agent, tokenizer=tokenizer, store=open_store("memory://")
    )
    assert (demos.rollouts, demos.kept, demos.rejected) == (6, 0, 6)  # all scored 0.0


def test_shared_prefix_gives_the_same_loss_and_update(
    tiny_model_path: Path, demos: Demonstrations
) -> None:
    """Every prompt starts with the same system message: run once, continued from its KV
    cache, it must change nothing but the cost."""
    import torch

    from boltrl_trainer.models import load_model
    from boltrl_trainer.sft import SFTBackend

    items = [t for t in demos.transitions if t.task_id.startswith("t")]  # one system prompt
    assert SFTBackend.shared_prefix(items) >= 16
    runs = []
    for share in (True, False):
        model, _ = load_model(tiny_model_path)
        sft = SFTBackend(model, lr=1e-2, pad_id=2, token_budget=100_000, share_prefix=share)
        loss = sft.loss(items)
        row = sft.step(items)
        grads = [p.grad.detach().clone() for p in sft.params if p.grad is not None]
        runs.append((loss, row["sft/grad_norm"], grads))
    (l1, n1, g1), (l2, n2, g2) = runs
    assert l1 == pytest.approx(l2, rel=1e-5) and n1 == pytest.approx(n2, rel=1e-4)
    assert len(g1) == len(g2) > 0
    for a, b in zip(g1, g2, strict=True):  # the same gradient, within float noise
        assert torch.allclose(a, b, rtol=1e-3, atol=1e-6 * float(b.abs().max()) + 1e-9)


def test_rows_of_two_prompts_are_packed_by_prompt_with_the_same_update(
    tiny_model_path: Path, demos: Demonstrations
) -> None:
    """Two agents' calls in one step (as a writer and a checker): each micro-batch holds
    one agent's rows and runs their shared prompt once; loss and gradients are those of
    the plain padded forward."""
    import torch

    from boltrl_trainer.batching import shared_prefix
    from boltrl_trainer.models import load_model
    from boltrl_trainer.sft import SFTBackend

    one = [t for t in demos.transitions if t.task_id.startswith("t")]
    other = [t.model_copy(update={"state": list(range(40, 70)) + t.state}) for t in one]
    items = [x for pair in zip(one, other, strict=True) for x in pair]  # interleaved
    longest = max(len(t.state) + len(t.action) for t in items)
    budget = 3 * longest  # too small for all rows padded, enough for one agent shared
    runs = []
    for share in (True, False):
        model, _ = load_model(tiny_model_path)
        sft = SFTBackend(model, lr=1e-2, pad_id=2, token_budget=budget, share_prefix=share)
        micro = sft._pack(items)
        if share:
            assert len(micro) == 2
            assert all(shared_prefix([items[i].state for i in b]) >= 16 for b in micro)
        loss = sft.loss(items)
        row = sft.step(items)
        grads = [p.grad.detach().clone() for p in sft.params if p.grad is not None]
        runs.append((loss, row["sft/grad_norm"], row["sft/microbatches"], grads))
    (l1, n1, m1, g1), (l2, n2, m2, g2) = runs
    assert m1 < m2  # fewer, fuller micro-batches
    assert l1 == pytest.approx(l2, rel=1e-5) and n1 == pytest.approx(n2, rel=1e-4)
    for a, b in zip(g1, g2, strict=True):
        assert torch.allclose(a, b, rtol=1e-3, atol=1e-6 * float(b.abs().max()) + 1e-9)
