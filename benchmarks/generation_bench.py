"""Where one demo step's generation time goes: 64 real demo requests through the backend.

The demo's policy served as ``boltrl demo`` serves it (SmolLM2-135M-Instruct + LoRA r16,
float32, ``serve_policy``: one ``TransformersBackend``, ``max_batch`` 64, 20 ms batch
window), one step's requests: 8 training problems x 8 samples, temperature 0.7, up to 16
new tokens. ``--spread-s S`` submits them from 64 threads at moments spread evenly over
S seconds (the demo's runner threads reach the gateway over a fraction of a second; 0
submits all at once). Per round: wall seconds, generated tokens/s, and the time inside
the model's forward passes split into prefill (passes over more than one new position)
and decode (one position per row), with the rest (sampling, stop checks, cache joins);
the number of passes, prompt positions computed by prefills, and mean rows per decode.

    uv run python benchmarks/generation_bench.py --rounds 3
    uv run python benchmarks/generation_bench.py --spread-s 0 --rounds 3   # all at once
    uv run python benchmarks/generation_bench.py --model tiny --rounds 1  # quick check
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def _timed_forwards(clock: dict[str, float]) -> Iterator[None]:
    """Time every forward pass of the sampling loop, split by its width."""
    from boltrl_trainer import _sampling

    original = _sampling._forward

    def forward(model: Any, cache_arg: str, cache: Any, **kwargs: Any) -> Any:
        ids = kwargs["input_ids"]  # [b, L]
        t0 = time.perf_counter()
        out = original(model, cache_arg, cache, **kwargs)
        dt = time.perf_counter() - t0
        kind = "prefill" if ids.shape[1] > 1 else "decode"
        clock[f"{kind}_s"] += dt
        clock[f"{kind}_passes"] += 1
        clock[f"{kind}_positions"] += ids.numel()
        return out

    _sampling._forward = forward
    try:
        yield
    finally:
        _sampling._forward = original


def _round(server: Any, requests: list[Any], spread_s: float) -> dict[str, float]:
    clock = dict.fromkeys(
        (f"{k}_{m}" for k in ("prefill", "decode") for m in ("s", "passes", "positions")), 0.0
    )
    results: list[Any] = [None] * len(requests)
    start = time.perf_counter() + 0.05

    def client(i: int) -> None:
        delay = start + spread_s * i / max(len(requests) - 1, 1) - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        results[i] = server.generate_sync(requests[i])

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(requests))]
    with _timed_forwards(clock):
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    wall = time.perf_counter() - start
    tokens = sum(len(g.response_token_ids or []) for g in results)
    return {"wall_s": wall, "tokens": tokens, "tokens_per_s": tokens / wall, **clock}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="smollm2", help="smollm2, tiny, or a path")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--spread-s", type=float, default=0.3)
    ap.add_argument("--problems", type=int, default=8)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--no-lora", action="store_true", help="serve the base model alone")
    ap.add_argument("--max-batch", type=int, default=None, help="default: the demo's (64)")
    args = ap.parse_args()

    from boltrl.gateway.backend import GenerationRequest
    from boltrl_trainer.config import load_config
    from boltrl_trainer.demo import DEMO_CONFIG, PROMPT, train_tasks
    from boltrl_trainer.models import tiny_model
    from boltrl_trainer.policy import load_policy, serve_policy

    model = str(tiny_model()) if args.model == "tiny" else args.model
    sets = [f"model={model}", f"max_tokens={args.max_tokens}", "out_dir=/tmp/unused"]
    sets.append(f"concurrency={args.max_batch or args.problems * args.samples}")
    cfg = load_config(None, sets, data=dict(DEMO_CONFIG))
    policy, tok = load_policy(cfg, lora=not args.no_lora)
    server = serve_policy(cfg, policy, tok)
    requests = [
        GenerationRequest(
            messages=[{"role": "user", "content": PROMPT.format(**t.input)}],
            temperature=cfg.temperature,
            max_tokens=cfg.max_tokens,
        )
        for t in train_tasks()[: args.problems]
        for _ in range(args.samples)
    ]
    import torch

    print(
        f"model {args.model}{'' if args.no_lora else ' + LoRA'}, {len(requests)} requests "
        f"({args.problems} problems x {args.samples}), max {args.max_tokens} new tokens, "
        f"arrivals over {args.spread_s:g} s, max_batch {server.max_batch}, torch threads "
        f"{torch.get_num_threads()}, load average {os.getloadavg()[0]:.2f}\n"
    )
    print(
        f"{'round':>5} {'wall s':>7} {'tok/s':>7} {'prefill s':>9} {'decode s':>8} "
        f"{'rest s':>7} {'prefills':>8} {'positions':>9} {'decodes':>7} {'rows/dec':>8}"
    )
    rounds = []
    try:
        for i in range(args.rounds):
            r = _round(server, requests, args.spread_s)
            rounds.append(r)
            rest = r["wall_s"] - r["prefill_s"] - r["decode_s"]
            rows = r["decode_positions"] / max(r["decode_passes"], 1)
            print(
                f"{i + 1:>5} {r['wall_s']:>7.2f} {r['tokens_per_s']:>7.1f} "
                f"{r['prefill_s']:>9.2f} {r['decode_s']:>8.2f} {rest:>7.2f} "
                f"{r['prefill_passes']:>8.0f} {r['prefill_positions']:>9.0f} "
                f"{r['decode_passes']:>7.0f} {rows:>8.1f}"
            )
    finally:
        server.close()
    keys = ("wall_s", "tokens_per_s", "prefill_s", "decode_s")
    med = {k: statistics.median(r[k] for r in rounds) for k in keys}
    print(
        f"\nmedian: {med['wall_s']:.2f} s, {med['tokens_per_s']:.1f} tokens/s; prefill "
        f"{med['prefill_s']:.2f} s, decode {med['decode_s']:.2f} s; load average "
        f"{os.getloadavg()[0]:.2f}"
    )


if __name__ == "__main__":
    main()
