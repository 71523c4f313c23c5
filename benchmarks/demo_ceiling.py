"""What `boltrl demo`'s strict reward lets RL reach: how the model's sampled replies score.

GRPO can only raise the probability of replies it samples. This samples the demo's model
(SmolLM2-135M-Instruct, no training) on the demo's 64 held-out problems, ``--samples``
replies each at each ``--temperatures`` value (and greedy once), through the same
``TransformersBackend`` the demo serves with, and sorts every reply by what the demo's
scorer gives it:

- ``bare right`` (1.0): only the correct sum;
- ``bare wrong`` (0.0): only a number, not the sum;
- ``words right`` (0.5): the correct sum as the last number among words or working;
- ``other`` (0.0).

It also counts the problems where at least one of a group's samples is a bare right reply:
the only groups in which a GRPO step can push towards full credit.

    uv run python benchmarks/demo_ceiling.py --samples 8 --temperatures 0.7 1.0 1.3
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

_NUMBER = re.compile(r"-?\d+")


def kind(reply: str, answer: int) -> str:
    from boltrl_trainer.demo import score

    text = reply.strip().rstrip(".").replace(",", "").strip()
    if _NUMBER.fullmatch(text) is not None:
        return "bare right" if score(reply, answer) == 1.0 else "bare wrong"
    return "words right" if score(reply, answer) == 0.5 else "other"


KINDS = ("bare right", "bare wrong", "words right", "other")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--samples", type=int, default=8, help="replies per problem and temperature")
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.7, 1.0, 1.3])
    ap.add_argument("--init-from", help="a checkpoint to sample instead of the base model")
    ap.add_argument("--model", help="another model than the demo's (tests: the tiny one)")
    ap.add_argument("--limit", type=int, help="only the first N held-out problems")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    from boltrl.gateway.backend import GenerationRequest
    from boltrl_trainer.config import load_config
    from boltrl_trainer.demo import DEMO_CONFIG, PROMPT, val_tasks
    from boltrl_trainer.policy import load_policy, serve_policy

    overrides = ["out_dir=/tmp/unused", *([f"model={args.model}"] if args.model else [])]
    cfg = load_config(None, overrides, data=dict(DEMO_CONFIG))
    model, tok = load_policy(cfg)
    if args.init_from:
        from boltrl_trainer.update import load_trainable

        load_trainable(model, Path(args.init_from))
    server = serve_policy(cfg, model, tok)
    tasks = val_tasks()[: args.limit]
    load0 = os.getloadavg()[0]
    rows: list[dict[str, Any]] = []
    try:
        for temperature in [0.0, *args.temperatures]:
            n = 1 if temperature == 0.0 else args.samples
            t0 = time.perf_counter()
            futures = [
                (
                    t,
                    server.submit(
                        GenerationRequest(
                            messages=[{"role": "user", "content": PROMPT.format(**t.input)}],
                            temperature=temperature,
                            max_tokens=cfg.max_tokens,
                        )
                    ),
                )
                for t in tasks
                for _ in range(n)
            ]
            counts = dict.fromkeys(KINDS, 0)
            groups_with_bare_right: set[str] = set()
            for t, f in futures:
                k = kind(f.result().text or "", t.input["a"] + t.input["b"])
                counts[k] += 1
                if k == "bare right":
                    groups_with_bare_right.add(t.id)
            total = len(futures)
            rows.append(
                {
                    "temperature": temperature,
                    "replies": total,
                    **{k: counts[k] / total for k in KINDS},
                    "mean reward": (counts["bare right"] + 0.5 * counts["words right"]) / total,
                    "problems with a bare right reply": len(groups_with_bare_right),
                    "wall_s": time.perf_counter() - t0,
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    finally:
        server.close()
    print(
        f"\nmodel {cfg.model}{' + ' + args.init_from if args.init_from else ''}, "
        f"{len(tasks)} held-out problems, load {load0:.1f} -> {os.getloadavg()[0]:.1f}\n"
    )
    print(
        "| temperature | replies | bare right (1.0) | bare wrong | words right (0.5) | other "
        "| mean reward | problems with a bare right reply |\n"
        "|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    for r in rows:
        name = "greedy" if r["temperature"] == 0.0 else f"{r['temperature']:g}"
        print(
            f"| {name} | {r['replies']} | "
            + " | ".join(f"{100 * r[k]:.1f}%" for k in KINDS)
            + f" | {r['mean reward']:.3f} | {r['problems with a bare right reply']} |"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
