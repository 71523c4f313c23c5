"""``boltrl train``, ``boltrl eval`` and ``boltrl demo``."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from boltrl.errors import BoltrlError
from boltrl_trainer.cli_report import ConsoleReporter
from boltrl_trainer.cli_sft import sft_args, sft_run
from boltrl_trainer.failures import AllRolloutsFailed

__all__ = ["ConsoleReporter", "register"]


def _train_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="YAML config (see boltrl_trainer.config.TrainConfig)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config field, e.g. --set steps=4 --set algo.kl_coef=0.01",
    )
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    p.add_argument("--out", default=None, help="output folder (overrides out_dir)")


def _load(args: argparse.Namespace) -> Any:
    from boltrl_trainer.config import load_config

    overrides = list(args.overrides)
    if getattr(args, "out", None):
        overrides.append(f"out_dir={args.out}")
    return load_config(args.config, overrides)


def _report(result: Any) -> None:
    out = result.out_dir
    print(f"metrics: {out / 'metrics.jsonl'} (TensorBoard: {out / 'tensorboard'})")
    if result.plot is not None:
        print(f"plot: {result.plot}")
    if result.val_before is not None and result.val_after is not None:
        print(f"val reward: {result.val_before:.3f} -> {result.val_after:.3f}")


def _train_run(args: argparse.Namespace) -> int:
    from boltrl_trainer.trainer import Trainer

    try:
        cfg = _load(args)
        result = Trainer(cfg, reporter=ConsoleReporter(progress=cfg.progress)).run(
            resume=args.resume
        )
    except AllRolloutsFailed as e:
        print(f"boltrl train: {e}", file=sys.stderr)
        return 1
    except BoltrlError as e:
        print(f"boltrl train: {e}", file=sys.stderr)
        return 2
    _report(result)
    return 0


def _eval_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="the same YAML config as for training")
    p.add_argument(
        "--split",
        action="append",
        default=None,
        choices=["train", "val", "test"],
        help="split(s) to evaluate (default: val, and test when configured)",
    )
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument(
        "--upstream",
        default=None,
        help="evaluate an OpenAI-compatible server instead (e.g. vLLM's /v1 URL)",
    )
    p.add_argument("--model", default=None, help="model name on the upstream server")
    p.add_argument("--checkpoint", default=None, help="a training checkpoint folder to load")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--limit", type=int, default=None, help="first N tasks of each split")
    p.add_argument("--per-task", type=int, default=20, help="task rows to print per split")
    p.add_argument("--report", default=None, help="write a JSON report here")
    p.add_argument(
        "--store",
        default=None,
        help="record the eval's rollouts in this store URL (default: the config's store)",
    )
    p.add_argument(
        "--run-name",
        default=None,
        help="the eval's run name in the store (default eval-YYYYmmdd-HHMMSS, UTC)",
    )


def _eval_run(args: argparse.Namespace) -> int:
    from boltrl_trainer.evaluate import all_failed, evaluate, format_table, write_report

    try:
        cfg = _load(args)
        splits = args.split or [s for s in ("val", "test") if getattr(cfg.tasks, s)]
        if not splits:
            print(
                "boltrl eval: the config names no val/test tasks; pass --split train",
                file=sys.stderr,
            )
            return 2
        results = evaluate(
            cfg,
            splits,
            upstream=args.upstream,
            model=args.model,
            checkpoint=args.checkpoint,
            temperature=args.temperature,
            limit=args.limit,
            store_url=args.store,
            run_name=args.run_name,
            reporter=ConsoleReporter(progress=cfg.progress),
        )
    except BoltrlError as e:
        print(f"boltrl eval: {e}", file=sys.stderr)
        return 2
    print(format_table(results, per_task=args.per_task))
    report = Path(args.report) if args.report else Path(cfg.out_dir) / "eval.json"
    write_report(results, report)
    print(f"report: {report}")
    if all_failed(results):
        lines = ["every rollout failed:"]
        for res in results:
            lines.extend(f"  {res.split}: {g.line()}" for g in res.errors)
        print("boltrl eval: " + "\n".join(lines), file=sys.stderr)
        return 1
    return 0


def _demo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=int, default=None, help="training steps (default 12)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="runs/demo", help="output folder (default runs/demo)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")


def _demo_run(args: argparse.Namespace) -> int:
    from boltrl_trainer.config import load_config
    from boltrl_trainer.demo import DEMO_CONFIG
    from boltrl_trainer.trainer import Trainer

    overrides = [f"seed={args.seed}", f"out_dir={args.out}", *args.overrides]
    if args.steps is not None:
        overrides.append(f"steps={args.steps}")
    print(
        "boltrl demo: GRPO on SmolLM2-135M-Instruct (LoRA, CPU) — two-digit addition.\n"
        "Full path: store → runners → agent (OpenAI client) → gateway → transitions → "
        "update.\n",
        flush=True,
    )
    t0 = time.perf_counter()
    try:
        cfg = load_config(None, overrides, data=dict(DEMO_CONFIG))
        reporter = ConsoleReporter(progress=cfg.progress)
        result = Trainer(cfg, run_name="demo", reporter=reporter).run()
    except BoltrlError as e:
        print(f"boltrl demo: {e}", file=sys.stderr)
        return 2
    print(f"done in {time.perf_counter() - t0:.0f}s")
    _report(result)
    return 0


def register(commands: Any) -> None:
    commands.add("train", "train an agent's model with RL (torch backend)", _train_args, _train_run)
    commands.add("eval", "evaluate an agent on task sets against a model", _eval_args, _eval_run)
    commands.add(
        "demo", "train SmolLM2-135M on CPU end to end and show the gain", _demo_args, _demo_run
    )
    commands.add(
        "sft", "warm-start a model on demonstrations through the real agent", sft_args, sft_run
    )
