"""``tune_malloc`` / ``update_phase`` (glibc): freed large blocks go back to the OS
during updates, stay in the heap (fast to reuse) while generating; off by environment."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only"
)

# ``churn()`` frees a 4 MiB block first (glibc's dynamic threshold then rises to 4 MiB, so
# later 1 MiB blocks come from the heap unless a static threshold says otherwise), then
# allocates 300 x 1 MiB, touches them and frees all but the last (which pins the heap's
# top): it returns the resident MB that stayed. Each probe prints its figures.
HEAD = """
import ctypes, threading
from boltrl_trainer.malloc_tuning import tune_malloc, update_phase
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
def churn():
    libc.free(libc.malloc(4 << 20))
    before = rss()
    blocks = [libc.malloc(1 << 20) for _ in range(300)]
    for b in blocks:
        ctypes.memset(b, 1, 1 << 20)
    for b in blocks[:-1]:
        libc.free(b)
    return rss() - before
"""

# The update churns first: its blocks then cannot reuse free heap chunks that an earlier
# generation left (they would stay resident until the next update trims them; bounded by
# generation's own heap, see malloc_tuning).
PHASES = """
applied = tune_malloc()
with update_phase():
    with update_phase():  # nested: the outer phase's settings hold until it ends
        pass
    update = churn()
generate = churn()
print(applied, round(update), round(generate))
"""

# Generation leaves ~300 MB of free heap resident; entering an update hands it back.
TRIM = """
applied = tune_malloc()
kept = churn()
before = rss()
with update_phase():
    trimmed = before - rss()
print(applied, round(kept), round(trimmed))
"""

# An update phase in another thread holds the update's settings for this one too.
THREADS = """
applied = tune_malloc()
entered, leave = threading.Event(), threading.Event()
def update():
    with update_phase():
        entered.set()
        leave.wait()
t = threading.Thread(target=update)
t.start()
entered.wait()
during = churn()
leave.set()
t.join()
print(applied, round(during), round(churn()))
"""


def _probe(body: str, tuning: str = "1") -> list[str]:
    env = {**os.environ, "BOLTRL_MALLOC_TUNING": tuning}
    out = subprocess.run(
        [sys.executable, "-c", HEAD + body], env=env, capture_output=True, text=True, check=True
    )
    return out.stdout.split()


def test_update_phase_returns_freed_blocks_generation_keeps_them() -> None:
    applied, update, generate = _probe(PHASES)
    assert applied == "True"
    assert float(update) < 20, update  # only the last block (and noise) stays resident
    assert float(generate) > 200, generate  # after it, the heap is reused: no page faults


def test_entering_an_update_trims_what_generation_freed() -> None:
    applied, kept, trimmed = _probe(TRIM)
    assert applied == "True"
    assert float(kept) > 200, kept
    assert float(trimmed) > 200, trimmed


def test_an_update_in_another_thread_holds_the_update_settings() -> None:
    applied, during, after = _probe(THREADS)
    assert applied == "True"
    assert float(during) < 20, during
    assert float(after) > 200, after


def test_off_by_environment_keeps_glibc_behaviour() -> None:
    applied, update, _ = _probe(PHASES, tuning="0")
    assert applied == "False"
    assert float(update) > 200, update  # glibc's default keeps the freed heap resident
