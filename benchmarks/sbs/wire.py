"""What ``benchmarks/run.py`` and its worker processes share: a line protocol and a few
measuring helpers. Standard library only: the peer's interpreter imports it too.

A worker reads one JSON request per line on stdin (``{"op": NAME, ...}``) and answers
each with one JSON line on stdout; a server process prints one JSON line saying where it
listens and serves until its stdin closes. Anything a library prints goes to stderr, so
it cannot corrupt the protocol.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any, TextIO

JSON = dict[str, Any]
Handler = Callable[[JSON], JSON]


_out: TextIO | None = None


def claim_stdout() -> None:
    """Keep stdout for the protocol: from here on, whatever this process or its children
    write to file descriptor 1 lands in stderr. Call it first thing in a worker."""
    global _out
    if _out is None:
        _out = os.fdopen(os.dup(1), "w", buffering=1)
        sys.stdout.flush()
        os.dup2(2, 1)


def _protocol_out() -> TextIO:
    claim_stdout()
    assert _out is not None
    return _out


def serve(handlers: dict[str, Handler]) -> None:
    """Answer requests until stdin closes; a failing handler answers ``{"error": ...}``."""
    out = _protocol_out()
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        try:
            reply = handlers[request.pop("op")](request)
        except Exception:
            reply = {"error": traceback.format_exc()}
        out.write(json.dumps(reply) + "\n")
        out.flush()


def announce(info: JSON) -> None:
    """Print where a server listens (one JSON line), then block until stdin closes."""
    out = _protocol_out()
    out.write(json.dumps(info) + "\n")
    out.flush()
    sys.stdin.read()


def rss_mb(pid: int | None = None) -> float:
    """Resident memory of a process (this one by default), in MiB."""
    path = f"/proc/{pid or os.getpid()}/status"
    with open(path) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def token_ids(n: int, salt: int = 0) -> list[int]:
    """``n`` token ids spread over a 150k vocabulary, as real ones are (not the small ints
    CPython caches, so each parsed id is an object of its own, as in production)."""
    return [256 + (i * 7919 + salt * 104729) % 150_000 for i in range(n)]


def percentile(xs: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) by the nearest-rank method."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * len(s)) - 1))]


def median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2
