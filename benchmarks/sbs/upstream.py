"""The common upstream both sides sit in front of: a boltrl gateway serving a
``ScriptedBackend`` on its plain (unrecorded) ``/v1`` route, which answers like vLLM
(``return_token_ids``: prompt and response token ids; ``logprobs``).

Replies are a function of the request only, so any number of agents can share it: while
a chat whose user turn says ``[tools=N]`` has fewer than N tool results, the model calls
the ``lookup`` tool; otherwise it answers with a fixed text.

    python benchmarks/sbs/upstream.py   # prints {"url": ...}; serves until stdin closes
"""

from __future__ import annotations

import re
from typing import Any

import wire

wire.claim_stdout()

from boltrl.gateway import Gateway  # noqa: E402
from boltrl.gateway.backend import GenerationRequest  # noqa: E402
from boltrl.testing import ScriptedBackend  # noqa: E402

ANSWER = "Paris will be sunny with a high of 24 degrees and a light wind: leave the umbrella."
_TAG = re.compile(r"\[tools=(\d+)\]")


def policy(request: GenerationRequest) -> str | dict[str, Any]:
    wanted = 0
    for m in request.messages:
        if m.get("role") == "user" and isinstance(m.get("content"), str):
            found = _TAG.search(m["content"])
            if found:
                wanted = int(found.group(1))
    done = sum(1 for m in request.messages if m.get("role") == "tool")
    if request.tools and done < wanted:
        return {"tool_calls": [{"name": "lookup", "arguments": {"city": "Paris", "step": done}}]}
    return ANSWER


def main() -> None:
    with Gateway(ScriptedBackend(policy, model="scripted")) as gw:
        wire.announce({"url": gw.url})


if __name__ == "__main__":
    main()
