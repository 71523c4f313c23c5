"""Agent Lightning's side of the side-by-side benchmarks (runs in the peer's own virtual
environment, ``benchmarks/.peer-venv``; it never imports boltrl).

    python benchmarks/sbs/peer_side.py server --upstream URL   # store server + LLM proxy
    python benchmarks/sbs/peer_side.py worker                  # answers run.py's requests

The server is the algorithm's half of Agent Lightning's standard deployment (what its
``Trainer`` sets up): an ``InMemoryLightningStore`` behind ``LightningStoreServer``, and
``LLMProxy`` (LiteLLM; its default middlewares and callbacks: rollout/attempt routing,
``return_token_ids``, OpenTelemetry export into the store) in front of the common
upstream, with ``--rollouts`` rollouts already started for the proxy workload. The worker
is the runner's half: ``AgentOpsTracer`` with its LangChain handler, sending spans to the
store server through ``LightningStoreClient``; it also runs the store and conversion
workloads. See ``benchmarks/run.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

from wire import JSON, announce, claim_stdout, rss_mb, serve, token_ids

claim_stdout()  # LiteLLM prints banners to stdout, in this process and its children
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import agentlightning as agl  # noqa: E402
from agentlightning.store import (  # noqa: E402
    InMemoryLightningStore,
    LightningStore,
    LightningStoreClient,
    LightningStoreServer,
)
from agentlightning.types import (  # noqa: E402
    EnqueueRolloutRequest,
    OtelResource,
    Span,
    TraceStatus,
)

logging.getLogger().setLevel(logging.ERROR)
LOOP = asyncio.new_event_loop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --------------------------------------------------------------------------- server


async def _server(upstream: str, rollouts: int) -> None:
    store = InMemoryLightningStore(thread_safe=True)
    server = LightningStoreServer(store, host="127.0.0.1", port=_free_port())
    await server.start()
    proxy = agl.LLMProxy(
        port=_free_port(),
        host="127.0.0.1",
        store=server,
        model_list=[
            {
                "model_name": "scripted",
                "litellm_params": {"model": "hosted_vllm/scripted", "api_base": f"{upstream}/v1"},
            }
        ],
    )
    await proxy.start()
    started = [await store.start_rollout(input={"proxy": i}) for i in range(rollouts)]
    await asyncio.get_running_loop().run_in_executor(
        None,
        announce,
        {
            "store": server.endpoint,
            "proxy": proxy.server_launcher.access_endpoint,
            "rollouts": [[a.rollout_id, a.attempt.attempt_id] for a in started],
        },
    )
    await proxy.stop()
    await server.stop()


# --------------------------------------------------------------------------- workloads 1 and 4


class Agents:
    """The LangChain agent captured the way Agent Lightning's runner does it: a rollout
    started in the store, the agent's model calls sent through the LLM proxy's
    rollout-scoped URL, run inside ``tracer.trace_context`` with the tracer's LangChain
    handler."""

    def __init__(self, store_url: str, proxy: str) -> None:
        import lc_agent

        self.lc = lc_agent
        self.store = LightningStoreClient(store_url)
        self.proxy = proxy
        self.tracer = agl.AgentOpsTracer()
        self.tracer.init_worker(0, self.store)
        self.n = 0
        self.collected: list[list[Span]] = []

    async def captured(
        self, tools: int, on_tool: Callable[[], None] | None = None, final: float | None = None
    ) -> tuple[float, str]:
        self.n += 1
        ar = await self.store.start_rollout(input={"i": self.n})
        rid, aid = ar.rollout_id, ar.attempt.attempt_id
        graph = self.lc.build(f"{self.proxy}/rollout/{rid}/attempt/{aid}/v1", on_tool)
        t0 = time.perf_counter()
        async with self.tracer.trace_context(name=rid, rollout_id=rid, attempt_id=aid):
            self.lc.run(graph, self.n, tools, [self.tracer.get_langchain_handler()])
            if final is not None:
                agl.emit_reward(final)
        took = time.perf_counter() - t0
        await self.store.update_attempt(rid, aid, status="succeeded")
        return took, rid

    async def spans(self, rid: str, calls: int, timeout_s: float = 30.0) -> list[Span]:
        """The rollout's spans once the proxy's (exported after it answers) are in."""
        deadline = time.monotonic() + timeout_s
        while True:
            spans = list(await self.store.query_spans(rid))
            proxied = sum(1 for s in spans if s.name == "raw_gen_ai_request")
            if proxied >= calls or time.monotonic() > deadline:
                return spans
            await asyncio.sleep(0.05)

    async def check(self, rid: str, calls: int) -> JSON:
        from agentlightning.adapter import TracerTraceToTriplet

        spans = await self.spans(rid, calls)
        triplets = TracerTraceToTriplet().adapt(spans)
        return {
            "spans": len(spans),
            "LLM spans (agent + proxy)": sum(
                1 for s in spans if s.name in ("openai.chat.completion", "raw_gen_ai_request")
            ),
            "triplets with token ids": sum(
                1 for t in triplets if t.prompt.get("token_ids") and t.response.get("token_ids")
            ),
        }


_agents: Agents | None = None


def _get_agents() -> Agents:
    assert _agents is not None, "capture_setup first"
    return _agents


def capture_setup(req: JSON) -> JSON:
    global _agents
    _agents = Agents(req["store"], req["proxy"])
    rid = ""
    for _ in range(req.get("warmup", 3)):
        _, rid = LOOP.run_until_complete(_agents.captured(req["tools"]))
    return {"check": LOOP.run_until_complete(_agents.check(rid, req["tools"] + 1))}


def capture(req: JSON) -> JSON:
    a = _get_agents()
    times = [
        LOOP.run_until_complete(a.captured(req["tools"]))[0] * 1e3 for _ in range(req["pairs"])
    ]
    return {"captured_ms": times}


def collect(req: JSON) -> JSON:
    """Run ``rollouts`` captured multi-turn rollouts (an intermediate reward per tool call,
    final reward 1.0, emitted as the runner emits a returned reward) and keep their spans."""
    a = _get_agents()

    async def run() -> list[list[Span]]:
        rids = [
            (await a.captured(req["tools"], on_tool=lambda: agl.emit_reward(0.1), final=1.0))[1]
            for _ in range(req["rollouts"])
        ]
        return [await a.spans(rid, req["tools"] + 1) for rid in rids]

    a.collected = LOOP.run_until_complete(run())
    first = [s for s in a.collected[0] if s.name == "openai.chat.completion"]
    return {
        "spans per rollout": sum(len(s) for s in a.collected) / len(a.collected),
        "prompt tokens": [len(s.attributes.get("prompt_token_ids") or ()) for s in first],  # type: ignore[arg-type]
    }


def _clone(spans: list[Span], j: int) -> list[Span]:
    """The rollout's spans under fresh ids (rollout, trace, span, parent), else unchanged."""

    def new(old: str | None) -> str | None:
        return None if old is None else f"{old}-{j}"

    return [
        s.model_copy(
            update={
                "rollout_id": f"{s.rollout_id}-{j}",
                "trace_id": new(s.trace_id),
                "span_id": new(s.span_id),
                "parent_id": new(s.parent_id),
            }
        )
        for s in spans
    ]


def convert(req: JSON) -> JSON:
    """Time ``TracerTraceToTriplet.adapt`` (the trainer's default adapter) over
    ``rollouts`` finished rollouts (copies of the collected ones), ``repeat`` times."""
    from agentlightning.adapter import TracerTraceToTriplet

    source = _get_agents().collected
    rollouts = [_clone(source[j % len(source)], j) for j in range(req["rollouts"])]
    adapter = TracerTraceToTriplet()
    times = []
    out: list[Any] = []
    for _ in range(req["repeat"]):
        t0 = time.perf_counter()
        out = [adapter.adapt(spans) for spans in rollouts]
        times.append((time.perf_counter() - t0) * 1e3)
    records = [t for ts in out for t in ts]
    return {
        "ms": times,
        "records": len(records),
        "with token ids": sum(
            1 for t in records if t.prompt.get("token_ids") and t.response.get("token_ids")
        ),
    }


# --------------------------------------------------------------------------- workload 3


def _span_template(tokens: int) -> Span:
    """A model-call span carrying what boltrl's ``LLMCall`` in the same workload carries:
    request and reply messages, prompt and response token ids, logprobs (as the peer's
    instrumentation stores them: ``logprobs.content``, JSON)."""
    logprobs = [
        {"token": f"token_id:{i}", "logprob": -0.5, "bytes": None, "top_logprobs": []}
        for i in token_ids(tokens // 4, 1)
    ]
    return Span(
        rollout_id="template",
        attempt_id="template",
        sequence_id=0,
        trace_id="0" * 32,
        span_id="0" * 16,
        parent_id=None,
        name="openai.chat.completion",
        status=TraceStatus(status_code="OK"),
        attributes={
            "gen_ai.request.model": "scripted",
            "gen_ai.prompt.0.role": "user",
            "gen_ai.prompt.0.content": "hi",
            "gen_ai.completion.0.role": "assistant",
            "gen_ai.completion.0.content": "ok",
            "gen_ai.completion.0.finish_reason": "stop",
            "gen_ai.response.id": "template",
            "prompt_token_ids": token_ids(tokens),
            "response_token_ids": token_ids(tokens // 4, 1),
            "logprobs.content": json.dumps(logprobs),
        },
        events=[],
        links=[],
        start_time=time.time(),
        end_time=time.time(),
        context=None,
        parent=None,
        resource=OtelResource(attributes={}, schema_url=""),
    )


def store(req: JSON) -> JSON:
    """enqueue → (dequeue → ``records`` times add_span → update_attempt succeeded) by
    ``workers`` concurrent asyncio workers (the store's API is async), for ``rollouts``
    rollouts, on a fresh in-memory store or the store server at ``url``."""
    workers, records = req["workers"], req["records"]
    rss_before = rss_mb()
    clients: list[LightningStore]
    if req["backend"] == "memory":
        clients = [InMemoryLightningStore()] * workers
    else:
        clients = [LightningStoreClient(req["url"]) for _ in range(workers)]
    template = _span_template(req["tokens"])
    requests = [EnqueueRolloutRequest(input={"i": i}) for i in range(req["rollouts"])]

    async def work(w: int) -> None:
        c = clients[w]
        while (ar := await c.dequeue_rollout(worker_id=f"w{w}")) is not None:
            rid, aid = ar.rollout_id, ar.attempt.attempt_id
            for k in range(records):
                span = template.model_copy(
                    update={
                        "rollout_id": rid,
                        "attempt_id": aid,
                        "sequence_id": k + 1,
                        "span_id": f"{k + 1:016x}",
                    }
                )
                await c.add_span(span)
            await c.update_attempt(rid, aid, status="succeeded")

    async def run() -> tuple[float, int, int]:
        t0 = time.perf_counter()
        await clients[0].enqueue_many_rollouts(requests)
        await asyncio.gather(*(work(w) for w in range(workers)))
        seconds = time.perf_counter() - t0
        done = list(await clients[0].query_rollouts(status_in=["succeeded"]))
        kept = len(await clients[0].query_spans(done[-1].rollout_id))
        return seconds, len(done), kept

    seconds, done, kept = LOOP.run_until_complete(run())
    rss_after = rss_mb()
    if done != req["rollouts"] or kept != records:
        raise RuntimeError(f"{done} rollouts succeeded, {kept} spans kept by one")
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
        asyncio.run(_server(args.upstream, args.rollouts))
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
    sys.exit(0)


if __name__ == "__main__":
    main()
