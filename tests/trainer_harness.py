"""Helpers of the trainer's end-to-end tests: a project folder for ``boltrl train`` / ``eval``
/ ``sft`` on the tiny model, the real CLI run in a subprocess, its JSONL metrics read back,
and warm-start demonstrations collected through a config's own agent.

The root ``pyproject.toml`` puts ``tests/`` on pytest's ``pythonpath``, so tests in any folder
``import trainer_harness`` (a unique name: ``conftest`` resolves ambiguously across folders)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from boltrl.loading import load_object
from boltrl.store import Store
from boltrl_trainer.config import TrainConfig
from boltrl_trainer.demonstrations import Demonstrations, collect

VOWEL_AGENT = textwrap.dedent(
    """
    from openai import OpenAI

    def agent(task, llm):
        client = OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
        reply = client.chat.completions.create(
            model=llm.model, messages=[{"role": "user", "content": task["prompt"]}]
        )
        text = reply.choices[0].message.content or ""
        # a reward with spread even for a random model: share of vowels in the reply
        return sum(c in "aeiou" for c in text) / max(len(text), 1)
    """
)
"""An agent (``agent.py:agent``) asking the model once about ``task["prompt"]``."""


def write_jsonl(path: Path, rows: Iterable[Mapping[str, Any]]) -> Path:
    """``rows`` as JSON Lines at ``path``."""
    path.write_text("".join(json.dumps(dict(r)) + "\n" for r in rows))
    return path


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The rows of a JSON Lines file (``metrics.jsonl``, an export)."""
    return [json.loads(x) for x in path.read_text().splitlines()]


def write_project(
    d: Path,
    config: Mapping[str, Any],
    *,
    files: Mapping[str, str],
    tasks: Mapping[str, Iterable[Mapping[str, Any]]],
) -> Path:
    """A project in ``d``: each of ``files`` (name -> source), each split of ``tasks`` as
    ``<split>.jsonl`` and ``config`` as ``train.yaml``, its ``tasks`` naming those files
    unless ``config`` names them itself. Returns ``d``."""
    for name, text in files.items():
        (d / name).write_text(text)
    for split, rows in tasks.items():
        write_jsonl(d / f"{split}.jsonl", rows)
    cfg = {"tasks": {split: f"{split}.jsonl" for split in tasks}, **config}
    (d / "train.yaml").write_text(yaml.safe_dump(cfg))
    return d


def run_cli(
    *args: str,
    cwd: Path,
    timeout: float = 240,
    threads: int = 1,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``boltrl <args>`` in a subprocess, offline, torch at ``threads`` threads, with ``env``
    added to this process's environment."""
    return subprocess.run(
        [sys.executable, "-m", "boltrl.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": str(threads), **(env or {})},
    )


def run_cli_ok(*args: str, cwd: Path, **kw: Any) -> subprocess.CompletedProcess[str]:
    """``run_cli`` that must exit 0 (the failure shows the tail of stderr)."""
    proc = run_cli(*args, cwd=cwd, **kw)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def collect_demos(cfg: TrainConfig, tokenizer: Any, store: Store) -> Demonstrations:
    """``boltrl_trainer.demonstrations.collect`` for ``cfg``'s warm start, run by ``cfg``'s
    own agent, recording into ``store``."""
    assert cfg.warm_start is not None, "the config has no warm_start section"
    return collect(
        cfg,
        cfg.warm_start,
        agent=load_object(cfg.agent, what="agent"),
        tokenizer=tokenizer,
        store=store,
    )
