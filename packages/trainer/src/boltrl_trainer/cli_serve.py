"""``boltrl serve CONFIG``: serve an agent's model to live users and learn from their
feedback (``boltrl_trainer.serve``). CLI code: it prints."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any

from boltrl.errors import BoltrlError

__all__ = ["register"]


def _serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "config",
        help="a boltrl train YAML config with a serve: section (see boltrl_trainer.serve_config)",
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a field, e.g. --set serve.port=0 --set serve.gate.tolerance=0.05",
    )
    p.add_argument("--out", default=None, help="output folder (overrides out_dir)")


def _serve_run(args: argparse.Namespace) -> int:
    from boltrl_trainer.cli_report import ConsoleReporter
    from boltrl_trainer.serve import OnlineServer
    from boltrl_trainer.serve_config import load_serve_config

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    overrides = list(args.overrides)
    if args.out:
        overrides.append(f"out_dir={args.out}")
    try:
        cfg = load_serve_config(args.config, overrides)
        server = OnlineServer(cfg, reporter=ConsoleReporter(progress=False)).start()
    except BoltrlError as e:
        print(f"boltrl serve: {e}", file=sys.stderr)
        return 2
    try:
        out = cfg.out_dir
        print(
            f"boltrl serve: {cfg.train.model} on {server.url}\n"
            f"  agents: base_url {server.url}/sessions/SESSION_ID/v1 "
            f"(or header X-Boltrl-Session: SESSION_ID on {server.url}/v1)\n"
            f"  feedback: POST {server.url}/sessions/SESSION_ID/feedback "
            '{"reward": R}\n'
            f"  decisions: {out / 'promotions.jsonl'}; dashboard: boltrl dashboard --store "
            f"{cfg.train.store_url} --promotions {out / 'promotions.jsonl'}",
            flush=True,
        )
        learner: Any = server.learner
        while not stop.wait(1.0):
            if learner.error is not None:
                print(f"boltrl serve: the learner stopped: {learner.error}", file=sys.stderr)
                return 1
    finally:
        server.stop()
    print("boltrl serve stopped", flush=True)
    return 0


def register(commands: Any) -> None:
    commands.add(
        "serve",
        "serve an agent's model to live users and learn from their feedback",
        _serve_args,
        _serve_run,
    )
