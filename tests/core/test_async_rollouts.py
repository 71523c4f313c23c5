"""Async rollouts end like ``asyncio.run`` (issue 16 item 4): tasks the agent leaves
behind are cancelled (their ``finally`` runs), async generators are finished, and no
"Task was destroyed but it is pending!" or "Event loop is closed" reaches the output.

Run in a fresh interpreter so that what the garbage collector and interpreter exit
print is captured too.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.timeout(120)

SCRIPT = textwrap.dedent(
    """
    import asyncio, gc, logging

    import agents
    from agents import Agent, OpenAIChatCompletionsModel, Runner
    from openai import AsyncOpenAI

    import boltrl
    from boltrl.testing import ScriptedBackend
    from boltrl_openai_agents import BoltrlTracingProcessor

    logging.basicConfig(level=logging.WARNING)
    agents.set_trace_processors([BoltrlTracingProcessor()])
    cleaned = []

    async def background_logger():  # like LiteLLM's logging worker: never ends itself
        try:
            while True:
                await asyncio.sleep(3600)
        finally:
            cleaned.append("task")

    async def ticks():
        try:
            while True:
                yield 1
        finally:
            cleaned.append("asyncgen")

    async def agent(task, llm):
        asyncio.create_task(background_logger())
        gen = ticks()
        await gen.__anext__()  # left suspended, never closed by the agent
        client = AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key)  # never closed
        model = OpenAIChatCompletionsModel(model=llm.model, openai_client=client)
        helper = Agent(name="helper", instructions="Be brief.", model=model)
        result = await Runner.run(helper, task["q"])
        return 1.0 if result.final_output == "done" else 0.0

    for i in range(4):
        r = boltrl.run_rollout(agent, {"q": f"go {i}"}, backend=ScriptedBackend(["done"]))
        assert r.status == "succeeded" and r.reward == 1.0, (r.status, r.error)
        assert len(r.calls) == 1 and r.calls[0].agent == "helper", r.calls
    gc.collect()
    print("cleaned", sorted(cleaned), flush=True)
    """
)


def test_async_agent_leaving_tasks_prints_nothing_and_its_tasks_are_cancelled() -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONASYNCIODEBUG": "0"}
    proc = subprocess.run(
        [sys.executable, "-X", "dev", "-c", SCRIPT],
        capture_output=True,
        text=True,
        timeout=100,
        env=env,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    for bad in ("Task was destroyed but it is pending", "Event loop is closed", "Traceback"):
        assert bad not in out, out
    assert "cleaned " + str(["asyncgen"] * 4 + ["task"] * 4) in out, out
