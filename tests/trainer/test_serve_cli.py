"""``boltrl serve CONFIG`` through the real CLI in a subprocess (tiny model): a config
error names its field; a served session is rated through the feedback route, the
learner promotes, and SIGINT stops everything cleanly with the decisions on disk."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml
from openai import OpenAI
from trainer_harness import run_cli

from boltrl.feedback import send_feedback
from boltrl.store import open_store
from boltrl_trainer.models import tiny_model


def _write(folder: Path, **serve: object) -> Path:
    cfg = {
        "agent": "boltrl_trainer.demo:agent",
        "model": str(tiny_model()),
        "max_tokens": 6,
        "concurrency": 4,
        "lora": {"r": 4, "alpha": 8},
        "report_to": ["jsonl"],
        "out_dir": "out",
        "serve": {
            "port": 0,
            "learn": {"every_sessions": 1, "poll_s": 0.2},
            "gate": {"tasks": "boltrl_trainer.demo:val_tasks", "limit": 2, "tolerance": 1.0},
            **serve,
        },
    }
    path = folder / "serve.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_config_error_names_the_field(tmp_path: Path) -> None:
    _write(tmp_path, learn={"every_minutes": -1})
    proc = run_cli("serve", "serve.yaml", cwd=tmp_path)
    assert proc.returncode == 2
    assert "serve.learn.every_minutes: Input should be greater than 0" in proc.stderr
    assert not (tmp_path / "out").exists()  # nothing started, nothing written


def test_serve_learns_from_feedback_then_stops_on_sigint(tmp_path: Path) -> None:
    _write(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "boltrl.cli", "serve", "serve.yaml"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"},
    )
    try:
        assert proc.stdout is not None
        lines: list[str] = []
        url = None
        deadline = time.time() + 120
        while url is None and time.time() < deadline:
            line = proc.stdout.readline()
            assert line, "boltrl serve exited early:\n" + "".join(lines)
            lines.append(line)
            m = re.search(r" on (http://127\.0\.0\.1:\d+)$", line.rstrip())
            url = m.group(1) if m else None
        assert url is not None, "".join(lines)
        client = OpenAI(base_url=f"{url}/sessions/chat-1/v1", api_key="k", max_retries=0)
        client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "What is 10 + 11?"}]
        )
        send_feedback(url, "chat-1", 1.0)
        log = tmp_path / "out" / "promotions.jsonl"
        while time.time() < deadline:  # the learner's poll picks the rated session up
            decisions = (
                [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
            )
            if len(decisions) >= 2:
                break
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = "".join(lines) + rest
    assert proc.returncode == 0, out
    assert "boltrl serve stopped" in out and "round 1: promote -> serving v1" in out
    assert [d["decision"] for d in decisions] == ["initial", "promote"]
    assert decisions[1]["sessions"] == 1 and decisions[1]["trained_sessions"] == 1
    store = open_store(f"sqlite:///{tmp_path / 'out' / 'store.db'}")
    try:
        session = store.get("session-chat-1")
        assert session.reward == 1.0 and [c.policy_version for c in session.calls] == [0]
    finally:
        store.close()
    assert json.loads((tmp_path / "out" / "served" / "policy.json").read_text()) == {"version": 1}
