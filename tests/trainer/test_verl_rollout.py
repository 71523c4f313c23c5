"""verl's vLLM servers as the gateway's upstream, without a GPU: two scripted
OpenAI-compatible servers (boltrl gateways that speak vLLM's ``return_token_ids``) stand
in for two vLLM replicas behind a ``ReplicaPool``, which a real rollout session serves
to a real agent. The engines' token ids are what the store records and what the verl
batch carries; a rollout's calls stay on one replica; weight updates pause the pool and
bump the policy version."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import openai
import pytest

from boltrl.credit import CreditConfig, transitions
from boltrl.gateway import Gateway
from boltrl.gateway.backend import GenerationRequest
from boltrl.records import LLM, RolloutStatus, Task
from boltrl.store import open_store
from boltrl.testing import SCRIPTED_LOGPROB, ScriptedBackend, render_prompt, render_reply
from boltrl_trainer.session import RolloutSession, Sampling, tag_tasks
from boltrl_trainer.verl.convert import token_ids, transitions_to_verl
from boltrl_trainer.verl.rollout import ReplicaPool, served_model


@pytest.fixture
def engines() -> Iterator[tuple[list[ScriptedBackend], list[str]]]:
    """Two "vLLM replicas": replica i answers ``SELECT i;`` and serves ``/models``."""
    backends = [ScriptedBackend([f"SELECT {i};"], model="Qwen2.5-Coder") for i in range(2)]
    with ExitStack() as stack:
        urls = []
        for b in backends:
            gw = Gateway(b)
            gw.start()
            stack.callback(gw.stop)
            urls.append(f"{gw.url}/v1")
        yield backends, urls


def agent(task: dict[str, Any], llm: LLM) -> float:
    """Two turns; reward 1 when the engine answered ``SELECT 1;`` both times."""
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    messages: list[Any] = [{"role": "user", "content": f"question {task['q']}"}]
    first = client.chat.completions.create(model=llm.model, messages=messages)
    messages += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "and now?"},
    ]
    second = client.chat.completions.create(model=llm.model, messages=messages)
    texts = {first.choices[0].message.content, second.choices[0].message.content}
    return 1.0 if texts == {"SELECT 1;"} else 0.0


def test_rollouts_run_on_the_engines_and_their_ids_reach_the_verl_batch(
    engines: tuple[list[ScriptedBackend], list[str]],
) -> None:
    backends, urls = engines
    assert served_model(urls[0]) == "Qwen2.5-Coder"
    pool = ReplicaPool(urls, "Qwen2.5-Coder", policy_version=3)
    store = open_store("memory://")
    sampling = Sampling(temperature=1.0, top_p=1.0, max_tokens=32)
    tasks = tag_tasks(
        [Task(input={"q": i}) for i in range(3)], run="t", step=1, phase="train", repeat=2
    )
    session = RolloutSession(agent, pool, store, concurrency=3, default_sampling=sampling)
    with session:
        rollouts = session.run(tasks, sampling, label="step 1")
        assert store.resources().model == "policy"
    assert [r.status for r in rollouts] == [RolloutStatus.SUCCEEDED] * 6
    # both replicas served, two calls per rollout, each rollout on one replica (so each
    # replica served whole rollouts: an even count). The split itself follows in-flight
    # load and timing, so it is not asserted.
    served = [b.calls for b in backends]
    assert sum(served) == 12 and all(n > 0 and n % 2 == 0 for n in served), served
    # a rollout scores 1 exactly when replica 1 served both its calls (the split varies)
    assert sorted(r.reward for r in rollouts) == [0.0] * (served[0] // 2) + [1.0] * (served[1] // 2)
    items = [t for r in rollouts for t in transitions(r, CreditConfig())]
    assert len(items) == 12
    for r in rollouts:
        calls = store.get(r.id).calls
        assert [c.policy_version for c in calls] == [3, 3]
        reply = "SELECT 1;" if r.reward == 1.0 else "SELECT 0;"
        first = [{"role": "user", "content": f"question {r.task.input['q']}"}]
        assert calls[0].prompt_token_ids == list(
            render_prompt(GenerationRequest(messages=first)).encode()
        )
        assert calls[0].response_token_ids == list(render_reply(reply).encode())
        assert calls[1].response_logprobs == [SCRIPTED_LOGPROB] * len(reply)
    vb = transitions_to_verl(items, [1.0] * 12, pad_id=0, multiple=8)
    assert vb.pad_rows == 4
    assert token_ids(vb)[:12] == [(t.state, t.action) for t in items]
    lp = vb.tensors["rollout_log_probs"][0, : len(items[0].action)]
    assert lp.tolist() == [SCRIPTED_LOGPROB] * len(items[0].action)
    pool.close()
    store.close()


def test_a_weight_update_waits_for_calls_in_flight_and_holds_new_ones(
    engines: tuple[list[ScriptedBackend], list[str]],
) -> None:
    backends, urls = engines
    backends[0]._delay_s = backends[1]._delay_s = 0.3
    pool = ReplicaPool(urls, "Qwen2.5-Coder")
    request = GenerationRequest(messages=[{"role": "user", "content": "q"}], rollout_id="r1")
    done: list[tuple[float, int | None]] = []

    def call() -> None:
        out = asyncio.run(pool.generate(request))
        done.append((time.monotonic(), out.policy_version))

    first = threading.Thread(target=call)
    started = time.monotonic()
    first.start()
    time.sleep(0.1)  # the first call is in flight (the engine takes 0.3 s)
    # the server's half of seams.weight_swap: pause, new weights, serve their version
    with pool.paused():
        assert time.monotonic() - started >= 0.29  # the update waited for it
        second = threading.Thread(target=call)
        second.start()
        time.sleep(0.2)
        assert len(done) == 1  # a new call waits while the weights change
        pool.set_policy_version(1)
    second.join(5)
    first.join(5)
    assert [v for _, v in done] == [0, 1]  # recorded under the version that served it
    assert pool.policy_version == 1
    assert pool.stats() == {
        "requests": 2,
        "prompt_tokens": 2 * len(render_prompt(request)),
        "completion_tokens": 2 * len("SELECT 0;"),
        "failed": 0,
    }
    pool.close()


def test_an_unreachable_server_is_reported_with_its_address() -> None:
    from boltrl.errors import BackendUnavailable

    with pytest.raises(BackendUnavailable, match=r"127\.0\.0\.1:9/v1 did not list its model"):
        served_model("http://127.0.0.1:9/v1", timeout_s=2.0)
    with pytest.raises(ValueError, match="at least one rollout server"):
        ReplicaPool([], "m")
