"""TransformersBackend throughput: dynamic batching vs one request at a time.

``--agents`` concurrent agents (asyncio tasks) each make ``--turns`` chat calls in a row,
each reply sampled at temperature 1 up to ``--max-tokens`` tokens, against one backend
holding the model. The same workload runs with ``max_batch=1`` (requests served one at a
time, as a plain generate-per-request server would) and with dynamic batching
(``max_batch=--agents``: requests start a loop together or join it between steps). The
two modes alternate ``--repeat`` times, so load from other processes on a shared machine
hits both alike; the figures are medians over the repeats. Prints completion tokens/s,
requests/s, mean batch (rows per forward pass) and the speedup; ``--json`` also writes
every run to a file.

    uv run python benchmarks/backend_bench.py [--model smollm2 --agents 8 --turns 2 \
        --max-tokens 32 --repeat 3]

``--ttft``: time to first token instead, through the real gateway and the official openai
client: ``--agents`` concurrent clients (threads) each make ``--turns`` chat calls, all
streamed (``stream=True``: the first text delta) or all not (the reply: its text is the
first a client sees), the two modes alternating ``--repeat`` times on one batched
backend. Prints the median time to first text and to the whole reply per mode.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from boltrl.gateway.backend import GenerationRequest
from boltrl_trainer.models import load_model
from boltrl_trainer.serving import TransformersBackend

TOPICS = ["a lighthouse", "the moon", "a robot", "rain", "a cat", "the sea", "a clock", "bread"]


def request(agent: int, turn: int, max_tokens: int) -> GenerationRequest:
    topic = TOPICS[agent % len(TOPICS)]
    messages = [{"role": "user", "content": f"Write a short story about {topic}."}]
    for t in range(turn):  # later turns carry a (fixed) history, so prompts differ in length
        messages += [
            {"role": "assistant", "content": f"Here is part {t + 1} of the story about {topic}."},
            {"role": "user", "content": "Continue the story."},
        ]
    return GenerationRequest(
        messages=messages, temperature=1.0, max_tokens=max_tokens, seed=agent * 100 + turn
    )


async def workload(backend: TransformersBackend, agents: int, turns: int, max_tokens: int) -> Any:
    latencies: list[float] = []
    tokens = 0

    async def agent(i: int) -> None:
        nonlocal tokens
        for turn in range(turns):
            t0 = time.perf_counter()
            gen = await backend.generate(request(i, turn, max_tokens))
            latencies.append(time.perf_counter() - t0)
            tokens += gen.usage["completion_tokens"]

    start = time.perf_counter()
    await asyncio.gather(*(agent(i) for i in range(agents)))
    return time.perf_counter() - start, tokens, latencies


def measure(model: Any, tokenizer: Any, max_batch: int, args: argparse.Namespace) -> dict[str, Any]:
    backend = TransformersBackend(
        model, tokenizer, max_batch=max_batch, batch_window_s=args.window, seed=0
    )
    try:
        backend.generate_sync(request(0, 0, 4))  # warm-up
        before = backend.stats()
        wall, tokens, latencies = asyncio.run(
            workload(backend, args.agents, args.turns, args.max_tokens)
        )
        after = backend.stats()
    finally:
        backend.close()
    steps = after["steps"] - before["steps"]
    return {
        "max_batch": max_batch,
        "wall_s": round(wall, 2),
        "completion_tokens": tokens,
        "tokens_per_s": round(tokens / wall, 1),
        "requests_per_s": round(args.agents * args.turns / wall, 2),
        # rows per forward pass (prefills included)
        "mean_batch": round((after["row_steps"] - before["row_steps"]) / steps, 2),
        "latency_p50_s": round(statistics.median(latencies), 2),
    }


def _timed_call(
    url: str, agent: int, turn: int, max_tokens: int, stream: bool
) -> tuple[float, float]:
    """(seconds to the first text the client sees, seconds to the whole reply)."""
    import openai

    client = openai.OpenAI(base_url=url, api_key="bench", max_retries=0, timeout=600)
    req = request(agent, turn, max_tokens)
    kw: Any = {
        "model": "policy",
        "messages": req.messages,
        "temperature": req.temperature,
        "max_tokens": req.max_tokens,
        "seed": req.seed,
    }
    t0 = time.perf_counter()
    if not stream:
        client.chat.completions.create(**kw)
        t = time.perf_counter() - t0
        return t, t
    first: float | None = None
    for chunk in client.chat.completions.create(**kw, stream=True):
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter() - t0
    total = time.perf_counter() - t0
    return (total if first is None else first), total


def measure_ttft(model: Any, tokenizer: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Both modes ``args.repeat`` times, alternating, on one batched backend."""
    from concurrent.futures import ThreadPoolExecutor

    from boltrl.gateway import Gateway

    backend = TransformersBackend(
        model, tokenizer, max_batch=args.agents, batch_window_s=args.window, seed=0
    )
    runs: dict[str, list[dict[str, float]]] = {"non-streamed": [], "streamed": []}
    try:
        backend.generate_sync(request(0, 0, 4))  # warm-up
        with Gateway(backend) as gw, ThreadPoolExecutor(args.agents) as pool:
            url = f"{gw.url}/v1"
            for rep in range(args.repeat):
                for name in runs:
                    stream = name == "streamed"

                    def agent(i: int, stream: bool = stream) -> list[tuple[float, float]]:
                        return [
                            _timed_call(url, i, turn, args.max_tokens, stream)
                            for turn in range(args.turns)
                        ]

                    calls = [c for f in pool.map(agent, range(args.agents)) for c in f]
                    r = {
                        "first_text_p50_s": round(statistics.median(c[0] for c in calls), 3),
                        "reply_p50_s": round(statistics.median(c[1] for c in calls), 3),
                        "load": round(os.getloadavg()[0], 1),
                    }
                    runs[name].append(r)
                    print(
                        f"  run {rep + 1} {name:>13}: first text {r['first_text_p50_s']:.3f} s  "
                        f"whole reply {r['reply_p50_s']:.3f} s  (p50 over {len(calls)} calls, "
                        f"load {r['load']})",
                        flush=True,
                    )
    finally:
        backend.close()
    summary = {
        name: {
            key: statistics.median(r[key] for r in rs)
            for key in ("first_text_p50_s", "reply_p50_s")
        }
        for name, rs in runs.items()
    }
    for name, m in summary.items():
        print(
            f"{name:>15}: time to first text {m['first_text_p50_s']:.3f} s, whole reply "
            f"{m['reply_p50_s']:.3f} s  (median of the runs' p50)"
        )
    return {"runs": runs, "summary": summary}


def add_arguments(p: argparse.ArgumentParser, prefix: str = "") -> None:
    """The benchmark's options (``prefix`` namespaces them inside another script's parser)."""
    p.add_argument(f"--{prefix}model", default="smollm2", help="model name or path")
    p.add_argument(f"--{prefix}agents", type=int, default=8, help="concurrent agents")
    p.add_argument(f"--{prefix}turns", type=int, default=2, help="calls per agent, in a row")
    p.add_argument(f"--{prefix}max-tokens", type=int, default=32, help="reply length cap")
    p.add_argument(f"--{prefix}repeat", type=int, default=3, help="alternating runs per mode")
    p.add_argument(f"--{prefix}window", type=float, default=0.01, help="batch window (s)")
    p.add_argument(f"--{prefix}threads", type=int, help="torch intra-op threads")
    p.add_argument(
        f"--{prefix}ttft",
        action="store_true",
        help="measure time to first token, streamed vs not, through the gateway",
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run both modes ``args.repeat`` times, alternating; print and return the figures."""
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = load_model(args.model)
    print(
        f"model={args.model} agents={args.agents} turns={args.turns} max_tokens={args.max_tokens} "
        f"repeat={args.repeat} cpus={os.cpu_count()} torch_threads={torch.get_num_threads()} "
        f"load={os.getloadavg()[0]:.1f}",
        flush=True,
    )
    if getattr(args, "ttft", False):
        return measure_ttft(model, tokenizer, args)
    modes = {"one at a time": 1, f"batched (max_batch={args.agents})": args.agents}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in modes}
    for rep in range(args.repeat):
        for name, max_batch in modes.items():
            r = measure(model, tokenizer, max_batch, args)
            runs[name].append(r)
            print(
                f"  run {rep + 1} {name:>24}: {r['tokens_per_s']:6.1f} tok/s  "
                f"mean batch {r['mean_batch']:.2f}  ({r['completion_tokens']} tokens in "
                f"{r['wall_s']} s, load {os.getloadavg()[0]:.1f})",
                flush=True,
            )
    summary = {}
    for name, rs in runs.items():
        summary[name] = {
            key: statistics.median(r[key] for r in rs)
            for key in ("tokens_per_s", "requests_per_s", "mean_batch", "latency_p50_s")
        }
        m = summary[name]
        print(
            f"{name:>26}: {m['tokens_per_s']:6.1f} tok/s  {m['requests_per_s']:5.2f} req/s  "
            f"mean batch {m['mean_batch']:.2f}  p50 latency {m['latency_p50_s']:.2f} s  (median)"
        )
    single, batched = (summary[name]["tokens_per_s"] for name in modes)
    ratios = [b["tokens_per_s"] / a["tokens_per_s"] for a, b in zip(*runs.values(), strict=True)]
    print(
        f"speedup: {batched / single:.2f}x (per repeat: {', '.join(f'{x:.2f}x' for x in ratios)})"
    )
    return {"runs": runs, "summary": summary, "speedup": batched / single}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_arguments(p)
    p.add_argument("--json", help="also write the results to this file")
    args = p.parse_args()
    results = run(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), **results}, f, indent=1)


if __name__ == "__main__":
    main()
