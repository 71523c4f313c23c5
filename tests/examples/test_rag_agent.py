"""examples/rag_agent: the corpus/question builder, the MuSiQue reader, the reward, the
BM25 search, scripted end-to-end rollouts through the real Agents SDK agent, and
``boltrl eval`` on the tiny model."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import boltrl
from boltrl.credit import CreditConfig
from boltrl.loading import load_object
from boltrl.records import RolloutStatus
from boltrl.testing import ScriptedBackend
from boltrl_trainer.config import load_config

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "rag_agent"
_SIBLINGS = ("data", "reward")


class Example:
    def __init__(self, agent: Any, data: ModuleType, reward: ModuleType, mod: ModuleType):
        self.agent, self.data, self.reward, self.module = agent, data, reward, mod


@pytest.fixture(scope="module")
def ex() -> Iterator[Example]:
    """The example's modules, loaded the way ``boltrl`` loads the agent file, without
    leaving its ``data`` / ``reward`` siblings (names other examples share) behind."""
    saved = {k: sys.modules.pop(k) for k in _SIBLINGS if k in sys.modules}
    path = list(sys.path)
    try:
        agent = load_object(f"{EXAMPLE / 'agent.py'}:agent", what="agent")
        yield Example(
            agent, sys.modules["data"], sys.modules["reward"], sys.modules[agent.__module__]
        )
    finally:
        for k in _SIBLINGS:
            sys.modules.pop(k, None)
        sys.modules.update(saved)
        sys.path[:] = path


@pytest.fixture(scope="module")
def docs(ex: Example) -> dict[str, dict[str, str]]:
    return {d["id"]: d for d in ex.data.load_corpus(EXAMPLE / "data" / "corpus.jsonl")}


def _hashes(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def _build(out: Path, *args: str) -> None:
    spec = importlib.util.spec_from_file_location("rag_agent_data_cli", EXAMPLE / "data.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(["--out", str(out), *args])


def test_builder_is_deterministic_and_the_shipped_data_is_its_output(
    tmp_path: Path, ex: Example, docs: dict[str, dict[str, str]]
) -> None:
    _build(tmp_path / "a", "--seed", "0")
    _build(tmp_path / "b", "--seed", "0")
    _build(tmp_path / "c", "--seed", "1")
    a = _hashes(tmp_path / "a")
    assert set(a) == {"corpus.jsonl", "train.jsonl", "val.jsonl", "test.jsonl"}
    assert a == _hashes(tmp_path / "b")
    assert a == _hashes(EXAMPLE / "data"), "shipped data differs from `python data.py`"
    assert all(a[k] != v for k, v in _hashes(tmp_path / "c").items())

    corpus, splits = ex.data.build(0)
    assert len(corpus) == 240 and len(docs) == 240, "document ids must be unique"
    assert {k: len(v) for k, v in splits.items()} == {"train": 280, "val": 60, "test": 60}
    questions = [t["question"] for tasks in splits.values() for t in tasks]
    assert len(questions) == len(set(questions)), "a question repeats across splits"
    for t in (t for tasks in splits.values() for t in tasks):
        first, second = (docs[d] for d in t["supporting"])
        assert first["title"] in t["question"], t  # hop 1 is named in the question
        assert second["title"] in first["text"], t  # hop 2 is named by hop 1's document
        assert t["answers"][0] in second["text"], t  # the answer is in hop 2's document
        assert t["answers"][0] not in t["question"] + first["text"], t


def test_search_finds_each_hop_by_its_name(ex: Example, docs: dict[str, dict[str, str]]) -> None:
    index = ex.module.corpus_index(ex.data.CORPUS)
    for t in ex.data.build(0)[1]["val"]:
        for doc_id in t["supporting"]:
            found = [d["id"] for d in index.search(docs[doc_id]["title"])]
            assert doc_id in found, (docs[doc_id]["title"], found)
    assert index.search("the of and") == []  # nothing but stopwords
    assert index.search("zzzqqq") == []


MUSIQUE = [
    {
        "id": "2hop__1_2",
        "paragraphs": [
            {"idx": 0, "title": "Lyon", "paragraph_text": "Lyon is a city in France.",
             "is_supporting": True},
            {"idx": 1, "title": "Ada", "paragraph_text": "Ada was born in Lyon.",
             "is_supporting": True},
            {"idx": 2, "title": "Bob", "paragraph_text": "Bob was born in Oslo.",
             "is_supporting": False},
        ],
        "question": "In which country was Ada born?",
        "question_decomposition": [],
        "answer": "France",
        "answer_aliases": ["French Republic"],
        "answerable": True,
    },
    {
        "id": "2hop__3_4",
        "paragraphs": [{"idx": 0, "title": "X", "paragraph_text": "Nothing.",
                        "is_supporting": False}],
        "question": "Unanswerable?",
        "answer": "",
        "answer_aliases": [],
        "answerable": False,
    },
]  # fmt: skip


def test_musique_reader(tmp_path: Path, ex: Example) -> None:
    path = tmp_path / "musique_full_v1.0_dev.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in MUSIQUE))
    tasks = ex.data.load_musique(path)
    assert tasks == [
        {
            "id": "2hop__1_2",
            "question": "In which country was Ada born?",
            "answers": ["France", "French Republic"],
            "supporting": ["p0", "p1"],
            "type": "musique",
            "documents": [
                {"id": "p0", "title": "Lyon", "text": "Lyon is a city in France."},
                {"id": "p1", "title": "Ada", "text": "Ada was born in Lyon."},
                {"id": "p2", "title": "Bob", "text": "Bob was born in Oslo."},
            ],
        }
    ]
    assert len(ex.data.load_musique(path, answerable_only=False)) == 2
    assert ex.data.as_task(MUSIQUE[0]) == tasks[0]


@pytest.mark.parametrize(
    ("reply", "answers", "reward"),
    [
        ("Thorirovia", ["Thorirovia"], 1.0),
        ("The answer is Thorirovia.", ["Thorirovia"], 1.0),
        ("Answer: thorirovia", ["Thorirovia"], 1.0),
        ("the sculptor", ["sculptor"], 1.0),
        ("French Republic", ["France", "French Republic"], 1.0),
        ("Thorirovia, I think", ["Thorirovia"], 0.5),
        ("North Thorirovia", ["Thorirovia"], 2 / 3),
        ("Howick", ["Thorirovia"], 0.0),
        ("", ["Thorirovia"], 0.0),
        (None, ["Thorirovia"], 0.0),
        ("...!?", ["Thorirovia"], 0.0),
        ("Answer:", ["Thorirovia"], 0.0),
        ("Thorirovia", [], 0.0),
    ],
)
def test_reward(ex: Example, reply: str | None, answers: list[str], reward: float) -> None:
    assert ex.reward.answer_f1(reply, answers) == pytest.approx(reward)


def _search(query: str) -> dict[str, Any]:
    return {"tool_calls": [{"name": "search", "arguments": {"query": query}}]}


def test_correct_trajectory(ex: Example, docs: dict[str, dict[str, str]]) -> None:
    task = ex.data.build(0)[1]["val"][0]
    hop1, hop2 = (docs[d]["title"] for d in task["supporting"])
    script = [_search(hop1), _search(hop2), task["answers"][0]]
    rollout = boltrl.run_rollout(ex.agent, task, backend=ScriptedBackend(script))
    assert rollout.status == RolloutStatus.SUCCEEDED, rollout.error
    assert rollout.reward == 1.0
    assert rollout.unjoined_calls == 0
    assert [c.agent for c in rollout.calls] == ["researcher"] * 3
    steps = rollout.tool_steps
    assert [(s.agent, s.name, s.arguments, s.error, s.call_id) for s in steps] == [
        ("researcher", "search", {"query": hop1}, None, rollout.calls[0].id),
        ("researcher", "search", {"query": hop2}, None, rollout.calls[1].id),
    ]
    assert steps[0].result.startswith(f"{hop1}: {docs[task['supporting'][0]]['text']}")
    assert docs[task["supporting"][1]]["text"] in steps[1].result
    # one intermediate reward per gold document, credited to the call whose search found it
    assert [(r.name, r.value, r.final) for r in rollout.rewards] == [("gold_doc", 0.1, False)] * 2
    calls, rewards = rollout.calls, rollout.rewards
    assert calls[0].seq < rewards[0].seq < calls[1].seq < rewards[1].seq < calls[2].seq
    # as return-to-go (credit mode discounted), each search is credited with what it found
    discounted = CreditConfig(mode="discounted", gamma=1.0)
    assert [t.reward for t in boltrl.transitions(rollout, discounted)] == pytest.approx(
        [1.2, 1.1, 1.0]
    )
    # train.yaml trains on the answer's F1 alone, the three calls (each prompt continues the
    # one before) merged into one transition
    credit = CreditConfig.from_dict(dict(load_config(EXAMPLE / "train.yaml").credit))
    assert (credit.mode, credit.merge_prefix) == ("final", True)
    assert [t.reward for t in boltrl.transitions(rollout, credit)] == pytest.approx([1.0])


def test_wrong_trajectories(ex: Example, docs: dict[str, dict[str, str]]) -> None:
    task = ex.data.build(0)[1]["val"][0]
    script = [_search("weather in Paris"), "Paris"]
    rollout = boltrl.run_rollout(ex.agent, task, backend=ScriptedBackend(script))
    assert (rollout.status, rollout.reward, rollout.unjoined_calls) == (
        RolloutStatus.SUCCEEDED,
        0.0,
        0,
    )
    assert [s.name for s in rollout.tool_steps] == ["search"]
    assert rollout.rewards == []

    # searching forever: the SDK stops after MAX_TURNS model calls; no answer, reward 0
    rollout = boltrl.run_rollout(ex.agent, task, backend=ScriptedBackend([_search("Paris")]))
    assert (rollout.status, rollout.reward, rollout.unjoined_calls) == (
        RolloutStatus.SUCCEEDED,
        0.0,
        0,
    )
    assert len(rollout.calls) == ex.module.MAX_TURNS

    # searching past the answer: both gold documents found, then no answer. Its bonuses
    # would return 0.2, more than a wrong answer after a failed search; train.yaml's
    # credit returns the answer's F1 alone, 0.0, as for any episode that never answered
    hop1, hop2 = (docs[d]["title"] for d in task["supporting"])
    script = [_search(hop1), _search(hop2)]  # the last reply repeats until MAX_TURNS
    rollout = boltrl.run_rollout(ex.agent, task, backend=ScriptedBackend(script))
    assert (rollout.status, rollout.reward) == (RolloutStatus.SUCCEEDED, 0.0)
    assert len(rollout.calls) == ex.module.MAX_TURNS
    assert [r.value for r in rollout.rewards] == [0.1, 0.1]
    discounted = CreditConfig(mode="discounted", gamma=1.0, merge_prefix=True)
    assert [t.reward for t in boltrl.transitions(rollout, discounted)] == pytest.approx([0.2])
    credit = CreditConfig.from_dict(dict(load_config(EXAMPLE / "train.yaml").credit))
    assert [t.reward for t in boltrl.transitions(rollout, credit)] == [0.0]


def test_a_raw_musique_record_is_a_task(ex: Example) -> None:
    script = [_search("Ada"), _search("Lyon"), "France"]
    rollout = boltrl.run_rollout(ex.agent, MUSIQUE[0], backend=ScriptedBackend(script))
    assert (rollout.status, rollout.reward, rollout.unjoined_calls) == (
        RolloutStatus.SUCCEEDED,
        1.0,
        0,
    )
    assert [r.value for r in rollout.rewards] == [0.1, 0.1]


def test_configs_validate_and_so_does_the_gpu_setting(tmp_path: Path) -> None:
    for name in ("train.yaml", "eval.yaml"):
        assert load_config(EXAMPLE / name).tasks.val is not None, name
    # train.yaml's commented GPU block, uncommented (what the README tells users to do)
    head, _, gpu = (EXAMPLE / "train.yaml").read_text().partition("\n# GPU")
    block = "\n".join(line[2:] for line in gpu.splitlines()[1:] if line.startswith("# "))
    (tmp_path / "gpu.yaml").write_text(head + "\n" + block + "\n")
    cfg = load_config(tmp_path / "gpu.yaml")
    assert (cfg.backend, cfg.model, cfg.dtype) == ("verl", "Qwen/Qwen2.5-1.5B-Instruct", "bfloat16")
    assert cfg.verl is not None and cfg.verl.tool_call_parser == "hermes"
    assert cfg.credit == {"mode": "final", "merge_prefix": True}


def test_boltrl_eval_on_the_tiny_model(tmp_path: Path) -> None:
    from boltrl_trainer.models import tiny_model

    report = tmp_path / "eval.json"
    args = f"eval {EXAMPLE / 'eval.yaml'} --split val --limit 2 --report {report}".split()
    for setting in (
        f"model={tiny_model()}",
        "max_tokens=8",
        "progress=false",
        f"out_dir={tmp_path}",
    ):
        args += ["--set", setting]
    proc = subprocess.run(
        [sys.executable, "-m", "boltrl.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines()[0].split() == ["split", "tasks", "reward", "±", "std", "failed"]
    assert proc.stdout.splitlines()[1].split()[:2] == ["val", "2"]
    data = json.loads(report.read_text())
    assert data["splits"]["val"]["tasks"] == 2
    assert [t["status"] for t in data["splits"]["val"]["per_task"]] == ["succeeded"] * 2
