"""The ``trl`` workload: ``boltrl demo`` beside TRL's GRPOTrainer on the same task.

Both sides train the same model (the converted SmolLM2-135M-Instruct folder from
boltrl's model cache) with the same LoRA, group size, prompts per step, temperature,
max new tokens, learning rate and steps, and score the same held-out problems greedily
before and after. Each run is a child process: boltrl's is ``boltrl demo`` itself (its
real store, runners, agent threads with OpenAI clients, gateway), TRL's is
``trl_side.py`` in TRL's own venv. Rounds alternate which side goes first; round ``i``
uses seed ``i`` on both sides. Peak memory is each child's ``ru_maxrss`` (``wait4``),
measured the same way for both.

Equal steps and equal wall time. boltrl runs ``2 x steps`` (``EXTRA_STEPS``) with a
validation every ``steps / 6`` steps; the equal-steps rows use its first ``steps`` steps
(their time, the validation at step ``steps``), and "held-out reward at TRL's training
time" is boltrl's last validation whose training time (the sum of its steps' wall time
so far, as TRL's ``train_s``) is at most that round's TRL training time. When boltrl's
``2 x steps`` end sooner, its last validation is taken: never more time than TRL had.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from procs import BENCHMARKS, ROOT, SBS
from wire import median

TRL_PINS = ["trl==1.16.0", "transformers==5.24.0", "peft==0.21.2"]
TORCH_PIN = "torch==2.13.0"
TORCH_WHEELS = Path(os.environ.get("BOLTRL_TORCH_WHEELS", "/opt/wheels"))
"""A folder holding the CPU torch wheel (``torch-2.13.0+cpu-…whl``); when it has none,
pip resolves ``torch==2.13.0`` from its configured index."""
TRL_VENV = BENCHMARKS / ".trl-venv"


@dataclass(frozen=True)
class TrlSizes:
    rounds: int
    steps: int
    batch_tasks: int
    group_size: int
    max_tokens: int
    val: int
    model: str
    """``smollm2`` (the demo's model) or ``tiny`` (the tiny random test model)."""

    def describe(self) -> str:
        return (
            f"{self.rounds} paired round(s) of {self.steps} steps, {self.batch_tasks} prompts "
            f"x {self.group_size} samples, {self.max_tokens} new tokens, {self.val} held-out "
            f"problems, model {self.model}"
        )


TRL_FULL = TrlSizes(
    rounds=2, steps=12, batch_tasks=8, group_size=8, max_tokens=16, val=64, model="smollm2"
)
TRL_QUICK = TrlSizes(
    rounds=1, steps=1, batch_tasks=2, group_size=2, max_tokens=8, val=4, model="tiny"
)


def _torch_requirement() -> str:
    wheels = sorted(TORCH_WHEELS.glob("torch-2.13.0+cpu-*.whl")) if TORCH_WHEELS.is_dir() else []
    return str(wheels[-1]) if wheels else TORCH_PIN


def ensure_trl_venv(venv: Path = TRL_VENV, *, rebuild: bool = False) -> Path:
    """TRL's interpreter, creating its venv (``python3 -m venv`` + pip) when missing or
    built for other requirements. Never touches the project's environment."""
    spec = "\n".join([_torch_requirement(), *TRL_PINS]) + "\n"
    marker = venv / "boltrl-bench-requirements.txt"
    python = venv / "bin" / "python"
    if not rebuild and python.exists() and marker.exists() and marker.read_text() == spec:
        return python
    print(f"building TRL's environment in {venv} (a few minutes) ...", flush=True)
    if not python.exists() or rebuild:
        subprocess.run(
            [
                os.environ.get("BOLTRL_PEER_BASE_PYTHON", "python3"),
                "-m",
                "venv",
                "--clear",
                str(venv),
            ],
            check=True,
        )
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            *spec.split(),
        ],
        check=True,
        env=env,
    )
    marker.write_text(spec)
    return python


def trl_versions(python: Path) -> dict[str, str]:
    code = (
        "import json, importlib.metadata as m; print(json.dumps({n: m.version(n) for n in "
        "['trl', 'transformers', 'peft', 'torch', 'accelerate', 'datasets']}))"
    )
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout))


def _settings(sizes: TrlSizes) -> dict[str, Any]:
    """The demo's settings at these sizes (``DEMO_CONFIG`` with the sizes applied)."""
    from boltrl_trainer.demo import DEMO_CONFIG, train_tasks, val_tasks
    from boltrl_trainer.models import resolve_model, tiny_model

    model = str(tiny_model()) if sizes.model == "tiny" else resolve_model(DEMO_CONFIG["model"])
    lora = {"r": 16, "alpha": 32, **DEMO_CONFIG["lora"]}
    from boltrl_trainer.config import LoraConfig

    lora["target_modules"] = LoraConfig(r=lora["r"], alpha=lora["alpha"]).target_modules
    return {
        "model": model,
        "steps": sizes.steps,
        "batch_tasks": sizes.batch_tasks,
        "group_size": sizes.group_size,
        "max_tokens": sizes.max_tokens,
        "temperature": DEMO_CONFIG["temperature"],
        "lr": DEMO_CONFIG["optim"]["lr"],
        "lora": lora,
        "train": [t.input for t in train_tasks()],
        "val": [t.input for t in val_tasks()[: sizes.val]],
    }


def _wait(p: subprocess.Popen[str], timeout_s: float) -> float:
    """Wait for ``p`` (killing it past ``timeout_s``); its peak RSS in MB."""
    deadline = time.monotonic() + timeout_s
    while True:
        pid, status, usage = os.wait4(p.pid, os.WNOHANG)
        if pid:
            p.returncode = os.waitstatus_to_exitcode(status)
            return usage.ru_maxrss / 1024
        if time.monotonic() > deadline:
            p.kill()
        time.sleep(0.2)


def val_curve(rows: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """(training seconds so far, held-out reward) at each validation of a boltrl run's
    metrics rows: the sum of the step times up to the validated step (TRL's ``train_s``
    clock: validations and model load left out)."""
    step_s = {r["step"]: r["time/step_s"] for r in rows if "time/step_s" in r}
    return sorted(
        (sum(t for k, t in step_s.items() if k <= r["step"]), r["val/reward_mean"])
        for r in rows
        if "val/reward_mean" in r
    )


EXTRA_STEPS = 2
"""boltrl's run is this many times ``steps`` long, for the equal-wall-time comparison."""


def run_boltrl(settings: dict[str, Any], seed: int, work: Path, timeout_s: float) -> dict[str, Any]:
    out = work / f"boltrl-seed{seed}"
    steps = settings["steps"]
    every = max(steps // 6, 1)  # six validations per `steps`, one landing on `steps`
    every = every if steps % every == 0 else steps
    sets = {
        "model": settings["model"],
        "batch_tasks": settings["batch_tasks"],
        "group_size": settings["group_size"],
        "concurrency": settings["batch_tasks"] * settings["group_size"],
        "max_tokens": settings["max_tokens"],
        "val_every": every,
        "tasks.limit_val": len(settings["val"]),
        "progress": "false",
    }
    argv = [
        sys.executable,
        "-m",
        "boltrl.cli",
        "demo",
        "--steps",
        str(steps * EXTRA_STEPS),
        "--seed",
        str(seed),
        "--out",
        str(out),
    ]
    for k, v in sets.items():
        argv += ["--set", f"{k}={v}"]
    log = work / f"boltrl-seed{seed}.log"
    t0 = time.perf_counter()
    with log.open("w") as f:
        p = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
        peak = _wait(p, timeout_s)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(
            f"boltrl demo failed ({p.returncode}); its log {log} ends:\n"
            + "\n".join(log.read_text().splitlines()[-20:])
        )
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    timed = {r["step"]: r for r in rows if "time/step_s" in r}
    first = [timed[k] for k in sorted(timed) if k <= steps]  # the equal-steps part
    val = {r["step"]: r["val/reward_mean"] for r in rows if "val/reward_mean" in r}
    tokens = sum(r["throughput/tokens_per_s"] * r["time/rollout_s"] for r in first)
    return {
        "step_s": [r["time/step_s"] for r in first],
        "generation_s": [r["time/generation_s"] for r in first],
        "generated_tokens": tokens,
        "val_before": val[0],
        "val_after": val[steps],
        "val_curve": val_curve(rows),
        "steps_run": len(timed),
        "train_s": sum(r["time/step_s"] for r in first),
        "wall_s": wall,
        "peak_mb": peak,
    }


def run_trl(
    python: Path, settings: dict[str, Any], seed: int, work: Path, timeout_s: float
) -> dict[str, Any]:
    spec = {**settings, "seed": seed, "out_dir": str(work / f"trl-seed{seed}")}
    log = work / f"trl-seed{seed}.log"
    t0 = time.perf_counter()
    with log.open("w") as err:
        p = subprocess.Popen(
            [str(python), str(SBS / "trl_side.py"), json.dumps(spec)],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            cwd=work,
        )
        peak = _wait(p, timeout_s)
        stdout = p.stdout.read() if p.stdout else ""
    if p.returncode != 0 or not stdout.strip():
        raise RuntimeError(
            f"TRL side failed ({p.returncode}); its log {log} ends:\n"
            + "\n".join(log.read_text().splitlines()[-20:])
        )
    r = dict(json.loads(stdout.strip().splitlines()[-1]))
    r["generated_tokens"] = sum(r["generated_tokens"])
    return {**r, "wall_s": time.perf_counter() - t0, "peak_mb": peak}


MEASURES = [
    # (measure, unit, better, from a run's result)
    ("seconds per step (median)", "s", "lower", lambda r: median(r["step_s"])),
    ("training wall time", "s", "lower", lambda r: r["train_s"]),
    (
        "generated tokens/s",
        "/s",
        "higher",
        lambda r: r["generated_tokens"] / max(sum(r["generation_s"]), 1e-9),
    ),
    ("peak memory (RSS)", "MB", "lower", lambda r: r["peak_mb"]),
    ("held-out reward after training", "", "higher", lambda r: r["val_after"]),
    ("held-out gain", "", "higher", lambda r: r["val_after"] - r["val_before"]),
    ("held-out reward at TRL's training time", "", "higher", lambda r: r["val_equal_time"]),
]


def _at_time(curve: list[list[float]], limit_s: float) -> tuple[float, float]:
    """The last (training time, held-out reward) of ``curve`` within ``limit_s``."""
    within = [(t, v) for t, v in curve if t <= limit_s]
    return within[-1] if within else (curve[0][0], curve[0][1])


def trl(peer_py: Path | None, logs: Path, sizes: TrlSizes, timeout_s: float = 3600) -> Any:
    """The workload's Report: rows per measure, each side's median over rounds."""
    from workloads import Report, compare

    settings = _settings(sizes)
    runs: dict[str, list[dict[str, Any]]] = {"boltrl": [], "trl": []}
    for i in range(sizes.rounds):
        order = ["boltrl", "trl"] if i % 2 == 0 else ["trl", "boltrl"]
        for side in order:
            if side == "trl" and peer_py is None:
                continue
            load = os.getloadavg()[0]
            if side == "boltrl":
                r = run_boltrl(settings, i, logs, timeout_s)
            else:
                assert peer_py is not None
                r = run_trl(peer_py, settings, i, logs, timeout_s)
            r["load"] = (load, os.getloadavg()[0])
            runs[side].append(r)
        b = runs["boltrl"][-1]  # the round's equal-wall-time figures
        if peer_py is not None:
            t = runs["trl"][-1]
            b["equal_time_s"], b["val_equal_time"] = _at_time(b["val_curve"], t["train_s"])
            t["equal_time_s"], t["val_equal_time"] = t["train_s"], t["val_after"]
        else:  # no TRL time to match: boltrl's whole run
            b["equal_time_s"], b["val_equal_time"] = b["val_curve"][-1]
        for side in order:
            if side == "trl" and peer_py is None:
                continue
            r = runs[side][-1]
            print(
                f"  trl workload, round {i + 1}, {side}: "
                f"{json.dumps({k: v for k, v in r.items() if not isinstance(v, list)})}",
                flush=True,
            )
    report = Report()
    for measure, unit, better, get in MEASURES:
        b = [get(r) for r in runs["boltrl"]]
        p = [get(r) for r in runs["trl"]] if peer_py is not None else None
        zero = p is not None and min(p) <= 0  # a reward or gain can be 0: no ratio then
        row = compare("5 · GRPO on the demo task", measure, unit, better, b, None if zero else p)
        if zero and p is not None:
            row.peer = median(p)
        report.rows.append(row)
    report.notes["runs"] = {
        side: [
            {
                k: (round(v, 3) if isinstance(v, float) else v)
                for k, v in r.items()
                if k not in ("step_s", "generation_s")
            }
            for r in rs
        ]
        for side, rs in runs.items()
        if rs
    }
    return report
