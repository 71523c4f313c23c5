"""The update's speed and memory by micro-batch token budget, and what bf16 costs.

Two parts, each configuration in a fresh child process (so a peak is its own):

``gen``: the demo's model (SmolLM2-135M-Instruct + LoRA r16) serves one demo step's 64
requests (8 problems x 8 samples, temperature 0.7, 16 new tokens) through
``TransformersBackend`` in float32 or bfloat16 weights: generated tokens/s, and the
mismatch between the logprobs the backend recorded (what the gateway stores) and the
ones the training backend recomputes — same dtype, and float32 weights recomputed under
bf16 autocast — as mean/max |diff| and the step-0 PPO ratio's spread. The float32 run's
samples are saved as the transitions of ``speed``.

``speed``: ``TorchTrainingBackend.update`` on those 64 transitions (GRPO advantages of
their real rewards) at each token budget, float32 or under bf16 autocast, with glibc's
malloc tuning on or off, and each distinct prompt computed once (the default: a group's
8 samples share it, ``_shared_prompt``) or every row's prompt on its own (``--plain``):
seconds per update (median of 3 after a warm-up), trained tokens/s, peak RSS.

    uv run python benchmarks/update_bench.py --budgets 512 1024 2048 4096
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _peak_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _setup(dtype: str, budget: int = 1024) -> tuple[Any, Any, Any]:
    from boltrl_trainer.algorithms import make_config
    from boltrl_trainer.config import load_config
    from boltrl_trainer.demo import DEMO_CONFIG
    from boltrl_trainer.policy import load_policy
    from boltrl_trainer.update import TorchTrainingBackend

    cfg = load_config(
        None,
        [f"dtype={dtype}", f"optim.token_budget={budget}", "out_dir=/tmp/unused"],
        data=dict(DEMO_CONFIG),
    )
    model, tok = load_policy(cfg)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    trainer = TorchTrainingBackend(
        model, make_config(cfg.algorithm, cfg.algo), cfg.optim, pad_id=int(pad)
    )
    return cfg, (model, tok), trainer


def _transitions(samples: list[dict[str, Any]]) -> tuple[list[Any], list[float]]:
    """Transitions of the samples and their GRPO advantages (reward minus group mean, over
    the group's std), as the trainer computes them."""
    from boltrl.records import Transition

    trans, adv = [], []
    groups: dict[str, list[float]] = {}
    for s in samples:
        groups.setdefault(s["group"], []).append(s["reward"])
    for i, s in enumerate(samples):
        rs = groups[s["group"]]
        mean, std = statistics.fmean(rs), statistics.pstdev(rs)
        trans.append(
            Transition(
                rollout_id=f"r{i}",
                task_id=s["group"],
                group=s["group"],
                step=0,
                agent=None,
                state=s["prompt"],
                action=s["response"],
                action_logprobs=s["logprobs"],
                action_mask=[1] * len(s["response"]),
                reward=s["reward"],
                done=True,
                policy_version=0,
                call_ids=[f"c{i}"],
            )
        )
        adv.append((s["reward"] - mean) / (std + 1e-6))
    return trans, adv


def _mismatch(trainer: Any, trans: list[Any], autocast: bool, temperature: float) -> dict[str, Any]:
    import torch

    diffs: list[float] = []
    ratios: list[float] = []
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    for i in range(0, len(trans), 16):
        part = trans[i : i + 16]
        x = trainer._tensors(part, [0.0] * len(part))
        with torch.no_grad(), ctx:
            new = trainer._logprobs(x, temperature).float()
        d = (new - x["old"])[x["mask"] > 0]
        diffs.extend(d.abs().tolist())
        ratios.extend(d.exp().tolist())
    dev = [abs(r - 1) for r in ratios]
    return {
        "mean_abs": statistics.fmean(diffs),
        "max_abs": max(diffs),
        "ratio_std": statistics.pstdev(ratios),
        "ratio_max_dev": max(dev),
        "outside_clip_0.2": sum(x > 0.2 for x in dev) / len(dev),
    }


def child_gen(spec: dict[str, Any]) -> dict[str, Any]:
    from boltrl.gateway.backend import GenerationRequest
    from boltrl_trainer.demo import PROMPT, score, train_tasks
    from boltrl_trainer.policy import serve_policy

    cfg, (model, tok), trainer = _setup(spec["dtype"])
    server = serve_policy(cfg, model, tok)
    tasks = train_tasks()[:8]
    reqs = [
        (
            t,
            GenerationRequest(
                messages=[{"role": "user", "content": PROMPT.format(**t.input)}],
                temperature=cfg.temperature,
                max_tokens=cfg.max_tokens,
            ),
        )
        for t in tasks
        for _ in range(cfg.group_size)
    ]
    rates = []
    _reset_peak()
    rss0 = _peak_mb()
    try:
        for _ in range(spec["rounds"]):
            t0 = time.perf_counter()
            futures = [server.submit(r) for _, r in reqs]
            gens = [f.result() for f in futures]
            wall = time.perf_counter() - t0
            rates.append(sum(len(g.response_token_ids or []) for g in gens) / wall)
    finally:
        server.close()
    samples = [
        {
            "group": t.id,
            "prompt": g.prompt_token_ids,
            "response": g.response_token_ids,
            "logprobs": g.response_logprobs,
            "reward": score(g.text or "", t.input["a"] + t.input["b"]),
        }
        for (t, _), g in zip(reqs, gens, strict=True)
    ]
    trans, _ = _transitions(samples)
    out: dict[str, Any] = {
        "tokens_per_s": rates,
        "rss_before_mb": rss0,
        "generation_peak_mb": _peak_mb(),
        "same_dtype": _mismatch(trainer, trans, False, cfg.temperature),
        "samples": samples,
    }
    if spec["dtype"] == "float32":
        out["autocast_bf16"] = _mismatch(trainer, trans, True, cfg.temperature)
    return out


def child_speed(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    from boltrl_trainer.seams import TrainBatch

    samples = json.loads(Path(spec["samples"]).read_text())
    _, _, trainer = _setup("float32", spec["budget"])
    trainer._share_states = trainer._share_states and spec.get("shared", True)
    trans, adv = _transitions(samples)
    batch = TrainBatch(trans, adv, 0, 0.7)
    ctx = (
        torch.autocast("cpu", dtype=torch.bfloat16)
        if spec["autocast"]
        else contextlib.nullcontext()
    )
    times, peaks = [], []
    for _ in range(1 + spec["repeat"]):
        _reset_peak()
        t0 = time.perf_counter()
        with ctx:
            m = trainer.update(batch)
        times.append(time.perf_counter() - t0)
        peaks.append(_peak_mb())
    tokens = m["update/tokens"]
    med = statistics.median(times[1:])
    return {
        "seconds": med,
        "first_s": times[0],
        "tokens": tokens,
        "tokens_per_s": tokens / med,
        "padded_tokens_per_s": sum(len(t.state) + len(t.action) for t in trans) / med,
        "microbatches": m["update/microbatches"],
        "shared_states": bool(m.get("update/shared_states", 0.0)),
        "peak_mb": max(peaks),
    }


def _child(spec: dict[str, Any], env: dict[str, str] | None = None) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile("w+", suffix=".json") as f:
        subprocess.run(
            [sys.executable, __file__, "--child", json.dumps(spec), "--out", f.name],
            check=True,
            env={**os.environ, **(env or {})},
        )
        return dict(json.loads(Path(f.name).read_text()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--budgets", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    ap.add_argument(
        "--untuned",
        type=int,
        nargs="*",
        default=[1024, 4096],
        help="budgets also measured with BOLTRL_MALLOC_TUNING=0",
    )
    ap.add_argument(
        "--bf16",
        type=int,
        nargs="*",
        default=[1024],
        help="budgets also measured under bf16 autocast",
    )
    ap.add_argument(
        "--plain",
        type=int,
        nargs="*",
        default=[512, 2048],
        help="budgets also measured with every row's prompt computed on its own",
    )
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--gen-rounds", type=int, default=2)
    ap.add_argument("--skip-gen", type=Path, help="reuse the samples of an earlier gen run")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--child")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.child:
        import torch

        torch.set_num_threads(int(os.environ.get("BOLTRL_BENCH_THREADS", "2")))
        from boltrl_trainer.malloc_tuning import tune_malloc

        tune_malloc()  # as Trainer.run does (BOLTRL_MALLOC_TUNING=0 leaves glibc's defaults)
        spec = json.loads(args.child)
        result = child_gen(spec) if spec["kind"] == "gen" else child_speed(spec)
        Path(args.out).write_text(json.dumps(result))
        return 0

    report: dict[str, Any] = {"load": [os.getloadavg()[0]]}
    work = Path(tempfile.mkdtemp(prefix="boltrl-update-bench-"))
    samples = args.skip_gen
    if samples is None:
        for dtype in ("float32", "bfloat16"):
            r = _child({"kind": "gen", "dtype": dtype, "rounds": args.gen_rounds})
            if dtype == "float32":
                samples = work / "samples.json"
                samples.write_text(json.dumps(r["samples"]))
            r.pop("samples")
            report[f"gen_{dtype}"] = r
            print(dtype, json.dumps(r), f"load {os.getloadavg()[0]:.1f}", flush=True)
    configs = [(b, False, True, True) for b in args.budgets]
    configs += [(b, False, True, False) for b in args.plain]
    configs += [(b, False, False, True) for b in args.untuned]
    configs += [(b, True, True, True) for b in args.bf16]
    report["speed"] = []
    for budget, autocast, tuned, shared in configs:
        spec = {
            "kind": "speed",
            "budget": budget,
            "shared": shared,
            "autocast": autocast,
            "repeat": args.repeat,
            "samples": str(samples),
        }
        r = _child(spec, None if tuned else {"BOLTRL_MALLOC_TUNING": "0"})
        row = {
            "budget": budget,
            "autocast_bf16": autocast,
            "malloc_tuning": tuned,
            **r,
            "load": os.getloadavg()[0],
        }
        report["speed"].append(row)
        print(json.dumps(row), flush=True)
    report["load"].append(os.getloadavg()[0])
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    print(
        "\n| token budget | prompts | dtype | malloc tuning | micro-batches | s / update "
        "| trained tok/s | peak MB | load |\n|---:|---|---|---|---:|---:|---:|---:|---:|"
    )
    for r in report["speed"]:
        print(
            f"| {r['budget']} | {'once per group' if r['shared_states'] else 'per row'} | "
            f"{'bf16 autocast' if r['autocast_bf16'] else 'fp32'} | "
            f"{'on' if r['malloc_tuning'] else 'off'} | {r['microbatches']:.0f} | "
            f"{r['seconds']:.1f} | {r['tokens_per_s']:.0f} | {r['peak_mb']:,.0f} | "
            f"{r['load']:.1f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
