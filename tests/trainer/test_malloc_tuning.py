"""``tune_malloc`` (glibc): freed large blocks go back to the OS; off by environment."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only"
)

# Frees a 4 MiB block first (glibc's dynamic threshold then rises to 4 MiB, so later 1 MiB
# blocks come from the heap), then allocates 300 x 1 MiB, touches them and frees all but
# the last (which pins the heap's top): prints the resident MB it kept.
PROBE = """
import ctypes, sys
from boltrl_trainer.malloc_tuning import tune_malloc
applied = tune_malloc()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
libc.free(libc.malloc(4 << 20))
before = rss()
blocks = [libc.malloc(1 << 20) for _ in range(300)]
for b in blocks:
    ctypes.memset(b, 1, 1 << 20)
for b in blocks[:-1]:
    libc.free(b)
print(applied, rss() - before)
"""


def _probe(tuning: str) -> tuple[bool, float]:
    env = {**os.environ, "BOLTRL_MALLOC_TUNING": tuning}
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True
    )
    applied, kept = out.stdout.split()
    return applied == "True", float(kept)


def test_tuned_process_returns_freed_blocks() -> None:
    applied, kept = _probe("1")
    assert applied
    assert kept < 20, kept  # only the last block (and noise) stays resident


def test_off_by_environment_keeps_glibc_behaviour() -> None:
    applied, kept = _probe("0")
    assert not applied
    assert kept > 200, kept  # glibc's default keeps the freed heap resident
