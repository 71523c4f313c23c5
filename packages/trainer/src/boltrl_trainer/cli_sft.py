"""``boltrl sft CONFIG``: the config's warm start alone (demonstrations -> SFT -> checkpoint)."""

from __future__ import annotations

import argparse
import sys

from boltrl.errors import BoltrlError

__all__ = ["sft_args", "sft_run"]


def sft_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="the YAML config of boltrl train, with a warm_start section")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config field, e.g. --set warm_start.limit=20 --set warm_start.epochs=1",
    )
    p.add_argument("--out", default=None, help="output folder (overrides out_dir)")


def sft_run(args: argparse.Namespace) -> int:
    from boltrl_trainer.cli_report import ConsoleReporter
    from boltrl_trainer.config import load_config
    from boltrl_trainer.warm_start import run_sft

    overrides = list(args.overrides)
    if args.out:
        overrides.append(f"out_dir={args.out}")
    try:
        cfg = load_config(args.config, overrides)
        result = run_sft(cfg, reporter=ConsoleReporter(progress=cfg.progress))
    except BoltrlError as e:
        print(f"boltrl sft: {e}", file=sys.stderr)
        return 2
    demo = result.demonstrations
    print(
        f"demonstrations: {demo['demo/kept']:.0f} of {demo['demo/rollouts']:.0f} rollouts kept "
        f"({demo['demo/transitions']:.0f} transitions, {demo['demo/tokens']:.0f} tokens)"
    )
    print(f"metrics: {result.out_dir / 'metrics.jsonl'}")
    print(f"checkpoint: {result.checkpoint}")
    if result.val_before is not None and result.val_after is not None:
        print(f"val reward: {result.val_before:.3f} -> {result.val_after:.3f}")
    print(f"done in {result.seconds:.0f}s")
    return 0
