"""Credit-assignment throughput: finished multi-turn rollouts -> transitions.

Builds N rollouts of T model calls each, the way a multi-turn chat agent produces them:
the first prompt has P tokens, each later prompt is the previous prompt + the previous
response (R tokens) + an observation (O tokens), so prompts grow by turn and every call
extends the one before it. Each rollout also carries one intermediate reward per call.
Times ``transitions_batch`` per mode, with and without prefix merge, and prints the best
of ``--repeat`` runs as microseconds per rollout.

    uv run python benchmarks/credit_bench.py [--rollouts 1000 --calls 6 --repeat 5]
"""

from __future__ import annotations

import argparse
import gc
import random
import time

from boltrl.credit import CreditConfig, transitions_batch
from boltrl.records import (
    Attempt,
    LLMCall,
    RewardEvent,
    Rollout,
    RolloutStatus,
    Task,
    Transition,
)


def make_rollout(i: int, calls: int, prompt: int, response: int, obs: int) -> Rollout:
    rng = random.Random(i)
    rid = f"ro-{i}"
    ids = [rng.randrange(50_000) for _ in range(prompt)]
    records: list[LLMCall] = []
    rewards: list[RewardEvent] = []
    seq = 0
    for t in range(calls):
        resp = [rng.randrange(50_000) for _ in range(response)]
        seq += 1
        records.append(
            LLMCall(
                id=f"{rid}-c{t}",
                seq=seq,
                rollout_id=rid,
                attempt=1,
                agent="solver",
                prompt_token_ids=ids,
                response_token_ids=resp,
                response_logprobs=[-rng.random() for _ in range(response)],
                policy_version=0,
            )
        )
        seq += 1
        rewards.append(RewardEvent(id=f"{rid}-r{t}", seq=seq, attempt=1, value=0.1))
        ids = ids + resp + [rng.randrange(50_000) for _ in range(obs)]
    return Rollout(
        id=rid,
        task=Task(id=f"task-{i % 100}", input={"i": i}),
        status=RolloutStatus.SUCCEEDED,
        reward=float(i % 2),
        attempts=[
            Attempt(
                rollout_id=rid,
                number=1,
                worker_id="w",
                started_at=0.0,
                lease_expires_at=0.0,
                last_heartbeat=0.0,
            )
        ],
        calls=records,
        rewards=rewards,
    )


def bench(rollouts: list[Rollout], cfg: CreditConfig, repeat: int) -> tuple[float, int, int]:
    """Best wall time over ``repeat`` runs, the transition count and the action tokens."""
    best = float("inf")
    out: list[Transition] = []
    for _ in range(repeat):
        out = []  # drop the previous run's transitions before collecting
        gc.collect()  # start each run from the same heap state; GC stays on while timing
        t0 = time.perf_counter()
        out = transitions_batch(rollouts, cfg)
        best = min(best, time.perf_counter() - t0)
    return best, len(out), sum(len(t.action) for t in out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollouts", type=int, default=1000)
    ap.add_argument("--calls", type=int, default=6, help="model calls per rollout")
    ap.add_argument("--prompt", type=int, default=200, help="first prompt length in tokens")
    ap.add_argument("--response", type=int, default=50, help="response length in tokens")
    ap.add_argument("--obs", type=int, default=30, help="observation tokens added per turn")
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    rollouts = [make_rollout(i, a.calls, a.prompt, a.response, a.obs) for i in range(a.rollouts)]
    print(
        f"{a.rollouts} rollouts x {a.calls} calls, prompt {a.prompt} tokens growing by "
        f"{a.response}+{a.obs} per turn; best of {a.repeat}"
    )
    print(f"{'credit':<34}{'total ms':>10}{'us/rollout':>12}{'transitions':>13}{'tokens':>10}")
    for name, cfg in [
        ("final", CreditConfig()),
        ("final, merge_prefix", CreditConfig(merge_prefix=True)),
        ("discounted gamma=0.9", CreditConfig("discounted", gamma=0.9)),
        ("discounted gamma=0.9, merge_prefix", CreditConfig("discounted", 0.9, None, True)),
    ]:
        secs, n, tokens = bench(rollouts, cfg, a.repeat)
        us = secs / a.rollouts * 1e6
        print(f"{name:<34}{secs * 1e3:>10.1f}{us:>12.1f}{n:>13}{tokens:>10}")


if __name__ == "__main__":
    main()
