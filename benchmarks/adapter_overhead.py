"""Adapter overhead: what each framework's boltrl callback adds to one model call.

Each framework has one function below that builds the same agent step (one model call,
the way an agent of that framework makes it) twice: without and with the framework's
boltrl callback. The harness runs both inside one real rollout (``boltrl.run_rollout``
on a ``ScriptedBackend`` served by the gateway on 127.0.0.1), alternating them call by
call (the order flipped every pair), and times each call in the agent's thread: wall
time, and the thread's CPU time (``time.thread_time``), which leaves out the gateway's
work and the waiting. The overhead is the median over pairs of CPU(with) - CPU(without):
pairing cancels the machine's load swings, which on a shared machine are ten times the
overhead itself, and the median ignores the odd garbage collection. A third arm with a
do-nothing callback of the SDK's own base class shows what the SDK itself charges for
dispatching to a callback; the rest is the boltrl callback's own work, which is also
timed directly: its hook methods wrapped with a timer (0.1 µs per event, included),
summed per call, the median over calls.

To add a framework: write ``def bench_<name>(llm) -> Arms`` (build the agent; return
its step without the callback, with it, and with a do-nothing callback of the SDK's own
base class), register it in ``FRAMEWORKS`` with the scripted reply its calls get.

    uv run python benchmarks/adapter_overhead.py [--frameworks langchain,dspy]
        [--pairs 300] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from boltrl.local import run_rollout
from boltrl.records import LLM
from boltrl.testing import ScriptedBackend

Step = Callable[[int], None]
"""One model call of the agent (``i``: the call's number, to vary the prompt)."""


@dataclass(frozen=True)
class Arms:
    """The same agent step three ways."""

    without: Step
    """No callback at all."""
    with_callback: Step
    """With the framework's boltrl callback."""
    noop_callback: Step | None = None
    """With a callback of the SDK's own base class that does nothing: what the SDK
    charges for dispatching to any callback (the floor under ours)."""
    callback: Any = None
    """The boltrl callback object ``with_callback`` uses: its ``on_*`` / ``emit`` methods
    are timed, giving the callback's own CPU time per call."""


def _time_hooks(obj: Any, spent: list[float]) -> None:
    """Wrap ``obj``'s hook methods (on the instance) to add the time spent in them to
    ``spent[0]`` while ``spent[1]`` is nonzero. Hooks never block, so their wall time
    is their CPU time; ``perf_counter`` costs 0.05 µs where ``thread_time`` costs 1."""
    for name in dir(type(obj)):
        if not (name.startswith("on_") or name == "emit"):
            continue
        fn = getattr(obj, name, None)
        if not callable(fn):
            continue

        def timed(*args: Any, _fn: Any = fn, **kwargs: Any) -> Any:
            if not spent[1]:
                return _fn(*args, **kwargs)
            t = time.perf_counter()
            try:
                return _fn(*args, **kwargs)
            finally:
                spent[0] += time.perf_counter() - t

        setattr(obj, name, timed)


SYSTEM = "You are a careful assistant. Answer briefly and cite the tool results you used."
QUESTION = "What is the weather in Paris tomorrow, and should I take an umbrella? (#{i})"
REPLY = "Sunny, 24 degrees; no umbrella needed."


# -- LangChain ---------------------------------------------------------------------------


def bench_langchain(llm: LLM) -> Arms:
    """``ChatOpenAI.invoke`` on a system + user prompt (``config={"callbacks": [...]}``)."""
    from langchain_core.callbacks import BaseCallbackHandler
    from langchain_openai import ChatOpenAI

    from boltrl_langchain import BoltrlCallbackHandler

    model = ChatOpenAI(base_url=llm.base_url, api_key=llm.api_key, model=llm.model)  # type: ignore[arg-type]
    handler = BoltrlCallbackHandler()

    def make(callbacks: list[Any]) -> Step:
        config: Any = {"callbacks": callbacks}

        def step(i: int) -> None:
            model.invoke([("system", SYSTEM), ("user", QUESTION.format(i=i))], config=config)

        return step

    noop = BaseCallbackHandler()
    noop.run_inline = True
    return Arms(make([]), make([handler]), make([noop]), callback=handler)


# -- DSPy --------------------------------------------------------------------------------


def bench_dspy(llm: LLM) -> Arms:
    """``dspy.Predict("question -> answer")`` (ChatAdapter prompt, ``cache=False``)."""
    import dspy
    from dspy.utils.callback import BaseCallback

    from boltrl_dspy import BoltrlCallback

    lm = dspy.LM(f"openai/{llm.model}", api_base=llm.base_url, api_key=llm.api_key, cache=False)
    predict = dspy.Predict("question -> answer")
    callback = BoltrlCallback()

    def make(callbacks: list[Any]) -> Step:
        def step(i: int) -> None:
            with dspy.context(lm=lm, callbacks=callbacks):
                predict(question=QUESTION.format(i=i))

        return step

    return Arms(make([]), make([callback]), make([BaseCallback()]), callback=callback)


DSPY_REPLY = f"[[ ## answer ## ]]\n{REPLY}\n\n[[ ## completed ## ]]"


# -- OpenAI Agents SDK -------------------------------------------------------------------


def _bench_openai_agents(llm: LLM, *, responses: bool) -> Arms:
    import asyncio

    import agents
    from agents import Agent, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner
    from agents.tracing import TracingProcessor
    from openai import AsyncOpenAI, DefaultAsyncHttpxClient

    from boltrl_openai_agents import BoltrlTracingProcessor

    class Noop(TracingProcessor):
        def on_trace_start(self, trace: Any) -> None: ...
        def on_trace_end(self, trace: Any) -> None: ...
        def on_span_start(self, span: Any) -> None: ...
        def on_span_end(self, span: Any) -> None: ...
        def shutdown(self) -> None: ...
        def force_flush(self) -> None: ...

    loop = asyncio.new_event_loop()
    # an explicit HTTP client: the default one schedules its own closing on whatever loop
    # runs when it is collected, which is the next framework's
    http = DefaultAsyncHttpxClient()
    client = AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key, http_client=http)
    kind = OpenAIResponsesModel if responses else OpenAIChatCompletionsModel
    agent = Agent(name="assistant", instructions=SYSTEM, model=kind(llm.model, client))

    def make(processors: list[Any]) -> Step:
        def step(i: int) -> None:
            # Processors are global: each step installs its own list (no exporter in
            # any), so every arm pays for the SDK's spans and only differs in processors.
            agents.set_trace_processors(processors)
            loop.run_until_complete(Runner.run(agent, QUESTION.format(i=i)))

        return step

    processor = BoltrlTracingProcessor()
    return Arms(make([]), make([processor]), make([Noop()]), callback=processor)


def bench_openai_agents(llm: LLM) -> Arms:
    """``Runner.run`` of one ``Agent`` on ``OpenAIResponsesModel`` (the SDK's default)."""
    return _bench_openai_agents(llm, responses=True)


def bench_openai_agents_chat(llm: LLM) -> Arms:
    """``Runner.run`` of one ``Agent`` on ``OpenAIChatCompletionsModel``."""
    return _bench_openai_agents(llm, responses=False)


# -- AutoGen -----------------------------------------------------------------------------


def bench_autogen(llm: LLM) -> Arms:
    """``AssistantAgent.run`` (reset before each call) on ``OpenAIChatCompletionClient``.
    "with" is the state ``boltrl_autogen.instrument()`` leaves: the handler attached and
    the event loggers enabled; the no-op arm is a ``logging.NullHandler`` with the loggers
    enabled the same way (AutoGen's log records are paid there too)."""
    import asyncio
    import logging

    from autogen_agentchat.agents import AssistantAgent
    from autogen_core import CancellationToken
    from autogen_core.models import ModelInfo
    from autogen_ext.models.openai import OpenAIChatCompletionClient

    from boltrl_autogen import AGENTCHAT_LOGGER, CORE_LOGGER, BoltrlEventHandler

    loop = asyncio.new_event_loop()
    info = ModelInfo(
        vision=False,
        function_calling=True,
        json_output=False,
        family="unknown",
        structured_output=False,
    )
    client = OpenAIChatCompletionClient(
        model=llm.model, base_url=llm.base_url, api_key=llm.api_key, model_info=info
    )
    agent = AssistantAgent("assistant", model_client=client, system_message=SYSTEM)
    loggers = [logging.getLogger(CORE_LOGGER), logging.getLogger(AGENTCHAT_LOGGER)]
    handlers: list[logging.Handler] = [BoltrlEventHandler(), logging.NullHandler()]

    def make(handler: logging.Handler | None) -> Step:
        def step(i: int) -> None:
            # every arm sets both loggers' level, propagation and handlers
            for lg, level in zip(loggers, (logging.INFO, logging.DEBUG), strict=True):
                lg.setLevel(level if handler else logging.NOTSET)
                lg.propagate = handler is None
                lg.handlers = [handler] if handler else []
            loop.run_until_complete(agent.on_reset(CancellationToken()))
            loop.run_until_complete(agent.run(task=QUESTION.format(i=i)))

        return step

    return Arms(make(None), make(handlers[0]), make(handlers[1]), callback=handlers[0])


FRAMEWORKS: dict[str, tuple[Callable[[LLM], Arms | tuple[Step, Step]], str]] = {
    "langchain": (bench_langchain, REPLY),
    "dspy": (bench_dspy, DSPY_REPLY),
    "openai-agents": (bench_openai_agents, REPLY),
    "openai-agents-chat": (bench_openai_agents_chat, REPLY),
    "autogen": (bench_autogen, REPLY),
}
"""name → (the function building the steps, the scripted reply their calls get). A
function may return ``(without, with_callback)`` instead of ``Arms``."""


# -- harness -----------------------------------------------------------------------------

WARMUP = 5


def measure(name: str, pairs: int) -> dict[str, Any]:
    """Run each arm ``pairs`` times, interleaved, in one rollout; µs per call."""
    build, reply = FRAMEWORKS[name]
    cpu: dict[str, list[float]] = {}
    wall: dict[str, list[float]] = {}
    spent = [0.0, 0.0]  # seconds in the callback's hooks this call; timing on (nonzero)
    own: list[float] = []

    def agent(task: dict[str, Any], llm: LLM) -> float:
        built = build(llm)
        a = built if isinstance(built, Arms) else Arms(*built)
        if a.callback is not None:
            _time_hooks(a.callback, spent)
        arms = {"without": a.without, "with": a.with_callback}
        if a.noop_callback is not None:
            arms["noop"] = a.noop_callback
        order = list(arms)
        for i in range(WARMUP):  # connections, lazy imports, first-call caches
            for step in arms.values():
                step(-1 - i)
        for i in range(pairs):
            for arm in order if i % 2 else order[::-1]:
                spent[:] = [0.0, float(arm == "with")]
                w, c = time.perf_counter(), time.thread_time()
                arms[arm](i)
                cpu.setdefault(arm, []).append((time.thread_time() - c) * 1e6)
                wall.setdefault(arm, []).append((time.perf_counter() - w) * 1e6)
                if spent[1] and a.callback is not None:
                    own.append(spent[0] * 1e6)
                spent[1] = 0.0
        return 1.0

    ro = run_rollout(agent, {}, backend=ScriptedBackend([reply]))
    if ro.error is not None:
        raise RuntimeError(f"the benchmark agent failed:\n{ro.error}")
    if len(ro.annotations) != pairs + WARMUP or ro.unjoined_calls:
        raise RuntimeError(
            f"{name}: {len(ro.annotations)} annotations for {pairs + WARMUP} calls "
            f"with the callback, {ro.unjoined_calls} unjoined"
        )
    med = statistics.median

    def over(arm: str) -> int | None:
        if arm not in cpu:
            return None
        return round(med([b - a for a, b in zip(cpu["without"], cpu[arm], strict=True)]))

    return {
        "framework": name,
        "pairs": pairs,
        "wall_us_without": round(med(wall["without"])),
        "wall_us_with": round(med(wall["with"])),
        "cpu_us_without": round(med(cpu["without"])),
        "cpu_us_with": round(med(cpu["with"])),
        "overhead_us": over("with"),
        "noop_overhead_us": over("noop"),
        "callback_self_us": round(med(own)) if own else None,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--frameworks", default=",".join(FRAMEWORKS), help="comma-separated names")
    p.add_argument("--pairs", type=int, default=300, help="calls without + with the callback")
    p.add_argument("--json", help="also write the figures to this file")
    args = p.parse_args()
    # offline: DSPy would otherwise try to refresh its model metadata on the first call
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault("DSPY_CACHEDIR", tempfile.mkdtemp(prefix="boltrl-bench-dspy-"))
    names = [n.strip() for n in args.frameworks.split(",") if n.strip()]
    unknown = [n for n in names if n not in FRAMEWORKS]
    if unknown:
        sys.exit(f"--frameworks: unknown {unknown}; known: {sorted(FRAMEWORKS)}")
    rows = []
    print("| framework | wall µs/call (without / with) | CPU µs/call (without / with) "
          "| overhead µs/call | SDK's no-op callback µs/call "
          "| callback's own CPU µs/call |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|")
    for name in names:
        r = measure(name, args.pairs)
        rows.append(r)
        print(
            f"| {name} | {r['wall_us_without']:,} / {r['wall_us_with']:,} | "
            f"{r['cpu_us_without']:,} / {r['cpu_us_with']:,} | "
            f"{r['overhead_us']:,} | {r['noop_overhead_us']} | {r['callback_self_us']} |",
            flush=True,
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
