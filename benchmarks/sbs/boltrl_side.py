"""boltrl's side of the side-by-side benchmarks (runs in the project's environment).

    python benchmarks/sbs/boltrl_side.py server --upstream URL   # store + gateway
    python benchmarks/sbs/boltrl_side.py worker                  # answers run.py's requests

The server is the trainer's half of a deployment: a memory store served over HTTP and
the gateway (``UpstreamBackend`` to the common upstream) recording into it, with
``--rollouts`` rollouts already claimed for the proxy workload's recorded routes. The
worker is the runner's half: the agent with ``BoltrlCallbackHandler``, recording over
HTTP; it also runs the store and conversion workloads. See ``benchmarks/run.py``.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from wire import JSON, announce, claim_stdout, rss_mb, serve, token_ids

claim_stdout()

from boltrl.records import LLMCall, Rollout, Task  # noqa: E402
from boltrl.store import HttpStore, MemoryStore, SqliteStore, Store  # noqa: E402

# --------------------------------------------------------------------------- server


def server(upstream: str, rollouts: int) -> None:
    from boltrl.gateway import Gateway
    from boltrl.gateway.upstream import UpstreamBackend
    from boltrl.store.server import serve_in_thread

    store = MemoryStore()
    ids = []  # the claimed attempts' recorded routes (lease token included)
    for _ in store.enqueue([Task(input={"proxy": i}) for i in range(rollouts)]):
        attempt = store.claim("proxy-bench", lease_s=24 * 3600)
        assert attempt is not None
        ids.append(attempt.route)
    with (
        serve_in_thread(store) as served,
        Gateway(UpstreamBackend(upstream, "scripted"), store) as gw,
    ):
        announce({"store": served.url, "gateway": gw.url, "rollouts": ids})


# --------------------------------------------------------------------------- workloads 1 and 4


class Agents:
    """The LangChain agent run bare (straight to the upstream) and captured (through the
    gateway, with ``BoltrlCallbackHandler``, in a rollout of the served store)."""

    def __init__(self, upstream: str, store_url: str, gateway: str) -> None:
        import lc_agent

        self.lc = lc_agent
        self.store = HttpStore(store_url)
        self.gateway = gateway
        self.bare_graph = lc_agent.build(f"{upstream}/v1")
        self.n = 0
        self.collected: list[Rollout] = []

    def bare(self, tools: int) -> float:
        self.n += 1
        t0 = time.perf_counter()
        self.lc.run(self.bare_graph, self.n, tools, [])
        return time.perf_counter() - t0

    def captured(self, tools: int, on_tool: Callable[[], None] | None = None) -> tuple[float, str]:
        from boltrl.context import RolloutContext
        from boltrl_langchain import BoltrlCallbackHandler

        self.n += 1
        [rid] = self.store.enqueue([Task(input={"i": self.n})])
        attempt = self.store.claim("agent", lease_s=600)
        assert attempt is not None and attempt.rollout_id == rid
        graph = self.lc.build(f"{self.gateway}{attempt.route}/v1", on_tool)
        t0 = time.perf_counter()
        with RolloutContext(attempt, self.store.record):
            self.lc.run(graph, self.n, tools, [BoltrlCallbackHandler()])
        took = time.perf_counter() - t0
        self.store.finish(attempt, "succeeded", reward=1.0)
        return took, rid

    def check(self, rid: str) -> JSON:
        """What one captured run left in the store."""
        ro = self.store.get(rid)
        return {
            "model calls": len(ro.calls),
            "with token ids": sum(1 for c in ro.calls if c.prompt_token_ids is not None),
            "annotations": len(ro.annotations),
            "tool steps": len(ro.tool_steps),
            "unjoined": ro.unjoined_calls,
        }


_agents: Agents | None = None


def _get_agents() -> Agents:
    assert _agents is not None, "capture_setup first"
    return _agents


def capture_setup(req: JSON) -> JSON:
    global _agents
    _agents = Agents(req["upstream"], req["store"], req["gateway"])
    for _ in range(req.get("warmup", 3)):
        _agents.bare(req["tools"])
        _, rid = _agents.captured(req["tools"])
    return {"check": _agents.check(rid)}


def capture(req: JSON) -> JSON:
    """``pairs`` bare and captured runs, alternating (order flipped every pair)."""
    a = _get_agents()
    bare: list[float] = []
    captured: list[float] = []
    for i in range(req["pairs"]):
        for arm in ("bare", "captured") if i % 2 else ("captured", "bare"):
            if arm == "bare":
                bare.append(a.bare(req["tools"]) * 1e3)
            else:
                captured.append(a.captured(req["tools"])[0] * 1e3)
    return {"bare_ms": bare, "captured_ms": captured}


def collect(req: JSON) -> JSON:
    """Run ``rollouts`` captured multi-turn rollouts (an intermediate reward per tool call,
    final reward 1.0) and keep them for ``convert``."""
    import boltrl

    a = _get_agents()
    rids = [
        a.captured(req["tools"], on_tool=lambda: boltrl.emit_reward(0.1))[1]
        for _ in range(req["rollouts"])
    ]
    a.collected = [a.store.get(rid) for rid in rids]
    calls = [c for ro in a.collected for c in ro.calls]
    return {
        "calls per rollout": len(calls) / len(rids),
        "prompt tokens": [len(c.prompt_token_ids or ()) for c in a.collected[0].calls],
        "rewards per rollout": sum(len(ro.rewards) for ro in a.collected) / len(rids),
    }


def _clone(ro: Rollout, j: int) -> Rollout:
    """The rollout under fresh ids (rollout, records), its content unchanged."""
    rid = f"{ro.id}-{j}"

    def moved(records: list[Any]) -> list[Any]:
        return [r.model_copy(update={"rollout_id": rid, "id": f"{r.id}-{j}"}) for r in records]

    return ro.model_copy(
        update={
            "id": rid,
            "attempts": [a.model_copy(update={"rollout_id": rid}) for a in ro.attempts],
            "calls": moved(ro.calls),
            "annotations": moved(ro.annotations),
            "tool_steps": moved(ro.tool_steps),
            "rewards": moved(ro.rewards),
        }
    )


def convert(req: JSON) -> JSON:
    """Time ``boltrl.transitions`` over ``rollouts`` finished rollouts (copies of the
    collected ones under fresh ids), ``repeat`` times."""
    from boltrl.credit import CreditConfig, transitions

    source = _get_agents().collected
    rollouts = [_clone(source[j % len(source)], j) for j in range(req["rollouts"])]
    cfg = CreditConfig(mode="discounted", gamma=1.0)
    times = []
    out: list[Any] = []
    for _ in range(req["repeat"]):
        t0 = time.perf_counter()
        out = [transitions(ro, cfg) for ro in rollouts]
        times.append((time.perf_counter() - t0) * 1e3)
    records = [t for ts in out for t in ts]
    return {
        "ms": times,
        "records": len(records),
        "with token ids": sum(1 for t in records if t.state and t.action),
    }


# --------------------------------------------------------------------------- workload 3


def _in_threads(n: int, fn: Callable[[int], None]) -> None:
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            fn(i)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def store(req: JSON) -> JSON:
    """enqueue → (claim → ``records`` times record one call → finish) by ``workers`` threads,
    for ``rollouts`` rollouts, on a fresh store of kind ``backend``."""
    backend, workers, records = req["backend"], req["workers"], req["records"]
    tokens = req["tokens"]
    rss_before = rss_mb()
    tmp = tempfile.TemporaryDirectory()
    handles: list[Store]
    if backend == "memory":
        handles = [MemoryStore()] * workers
    elif backend == "sqlite":
        handles = [SqliteStore(Path(tmp.name) / "bench.db")] * workers
    else:  # http, http-sqlite: the server at url
        handles = [HttpStore(req["url"]) for _ in range(workers)]
    template = LLMCall(
        id="template",
        rollout_id="template",
        attempt=1,
        request={"model": "scripted", "messages": [{"role": "user", "content": "hi"}]},
        response={"message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"},
        prompt_token_ids=token_ids(tokens),
        response_token_ids=token_ids(tokens // 4, 1),
        response_logprobs=[-0.5] * (tokens // 4),
    )
    tasks = [Task(input={"i": i}) for i in range(req["rollouts"])]

    def work(w: int) -> None:
        h = handles[w]
        while (att := h.claim(f"w{w}", lease_s=600)) is not None:
            rid, number = att.rollout_id, att.number
            for k in range(records):
                call = template.model_copy(
                    update={"id": f"{rid}-{k}", "rollout_id": rid, "attempt": number}
                )
                h.record(att, [call])
            h.finish(att, "succeeded", reward=1.0)

    t0 = time.perf_counter()
    handles[0].enqueue(tasks)
    _in_threads(workers, work)
    seconds = time.perf_counter() - t0
    rss_after = rss_mb()
    done = handles[0].count(status="succeeded")
    last = handles[0].query(status="succeeded", limit=1)[0]
    kept = len(handles[0].get(last.id).calls)
    for h in {id(h): h for h in handles}.values():
        h.close()
    tmp.cleanup()
    if done != req["rollouts"] or kept != records:
        raise RuntimeError(f"{done} rollouts succeeded, {kept} calls kept by one")
    return {"seconds": seconds, "rss_before_mb": rss_before, "rss_after_mb": rss_after}


# --------------------------------------------------------------------------- main


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="role", required=True)
    s = sub.add_parser("server")
    s.add_argument("--upstream", required=True)
    s.add_argument("--rollouts", type=int, default=32)
    sub.add_parser("worker")
    args = p.parse_args()
    if args.role == "server":
        server(args.upstream, args.rollouts)
    else:
        serve(
            {
                "capture_setup": capture_setup,
                "capture": capture,
                "collect": collect,
                "convert": convert,
                "store": store,
            }
        )


if __name__ == "__main__":
    main()
